#pragma once
/// \file
/// \brief The collectives each tensor-parallel mode issues, described once per piece of
/// the model and pass (docs/communication.md): the traffic closed forms, the predictor and
/// the planner sum these; the modes' own files (src/tp/collectives_*.cpp) state them beside
/// the code that issues them (mode_*.cpp, moe_*.hpp). No Kokkos, no MPI.

#include "cubelm/comm/layout.hpp"
#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/tp/buffers.hpp"

#include <string>
#include <utility>
#include <vector>

namespace cubelm::tp {

/// \brief The pieces of the model a tensor-parallel group runs for a micro-batch.
enum class Piece {
  lookup,    ///< the token and position embedding (the first stage)
  attention, ///< a layer's first LayerNorm, QKV, attention and output projection
  mlp,       ///< a dense layer's second LayerNorm and MLP
  moe,       ///< an MoE layer's second LayerNorm and MoE feed-forward
  head,      ///< ln_f, the tied head and the loss (the last stage)
  table      ///< the tied embedding table, once on a stage with the lookup or the head
};

/// \brief A piece's forward or its backward (a recomputed layer runs its forward again).
enum class Pass { forward, backward };

/// \brief `Collective::bytes` of elements of the model's compute type (compute_t:
/// gradients, statistics), 4 bytes whether the model stores float or bf16.
constexpr double kComputeElement = -1;

/// \brief `calls` collectives of `kind` on `group` whose messages add up to `elements`
/// elements of `bytes` bytes each: 0, the model's storage element (activations and the
/// weights the kernels read: 4 bytes in fp32, 2 in a bf16 model); kComputeElement; or
/// the size of another element (a token id, a double).
struct Collective {
  std::string group;
  comm::Kind kind = comm::Kind::all_reduce;
  double calls = 0;
  double elements = 0;
  double bytes = 0;
};

/// \brief The bytes of an element of `c` in a model storing `value_bytes`-byte values.
inline double element_bytes(const Collective& c, int value_bytes) {
  if (c.bytes > 0)
    return c.bytes;
  return c.bytes == kComputeElement ? compute_bytes(value_bytes) : value_bytes;
}

/// \brief The groups the pieces of `layout`'s mode talk on, with their ranks ("tp"; 2d
/// adds "tp.row" and "tp.col", 3d the axes "tp.a", "tp.b", "tp.c" and the planes "tp.ab",
/// "tp.bc", "tp.ca").
std::vector<std::pair<std::string, int>> collective_groups(const comm::Layout& layout);

/// \brief The collectives of `pass` through `piece` for a micro-batch of which this rank's
/// group holds `tokens` tokens (a share of each sequence with context parallelism).
std::vector<Collective> collectives(const comm::Layout& layout, const ModelConfig& model,
                                    double tokens, Piece piece, Pass pass);

} // namespace cubelm::tp
