#pragma once
/// \file
/// \brief The scratch buffers of the tensor modes, described once and without Kokkos.
///
/// Each part a mode builds on a rank (a linear, a LayerNorm, the embedding's lookup and
/// head) asks for scratch buffers by name ("2d/act", "3d/weight_block", ...). A name is
/// one buffer shared by every part of the mode on the rank, sized to the largest request
/// (tp::Mode's workspace). The modes reserve exactly these requests; the memory estimate
/// (cost/shape.hpp) takes the largest request per name over the parts of a stage, which
/// stage_scratch() enumerates as the model builds them. The MoE layers' own scratch
/// ("moe/...") is not described here.

#include "cubelm/comm/layout.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace cubelm::tp {

/// \brief One scratch buffer a part asks for: `elements` of the model's element type.
struct ScratchRequest {
  std::string_view name;
  std::int64_t elements = 0;
};
using ScratchRequests = std::vector<ScratchRequest>;

/// \brief A linear of `in` x `out` features over `rows` rows (as tp::Mode::linear gets
/// them); `second`: the second linear of a pair (Role::second).
ScratchRequests linear_scratch(const comm::Layout& layout, std::int64_t in, std::int64_t out,
                               std::int64_t rows, bool second);
/// \brief A LayerNorm of `features` over `rows` rows (tp::Mode::layernorm).
ScratchRequests layernorm_scratch(const comm::Layout& layout, std::int64_t features,
                                  std::int64_t rows);
/// \brief The embedding (tp::Mode::embedding) of `batch` sequences of `positions` tokens
/// here, `hidden` features and a `padded` vocabulary, with its lookup and/or its head.
ScratchRequests embedding_scratch(const comm::Layout& layout, bool lookup, bool head, int batch,
                                  std::int64_t positions, std::int64_t hidden, std::int64_t padded);

/// \brief The parts of one pipeline stage, as the model builds them: per layer ln1, qkv
/// (H -> H, first), proj (H -> H, second), ln2 and, in `layers - moe_layers` dense layers,
/// fc1 (H -> 4H, first) and fc2 (4H -> H, second); ln_f and the head on the last stage,
/// the lookup on the first.
struct StageParts {
  int batch = 1;              ///< sequences per micro-batch
  std::int64_t positions = 1; ///< tokens of each sequence here
  std::int64_t hidden = 1;
  std::int64_t padded_vocab = 1;
  int layers = 0, moe_layers = 0;
  bool first = true, last = true;
};
/// \brief Elements of the stage's scratch: the largest request per name, summed.
std::int64_t stage_scratch(const comm::Layout& layout, const StageParts& parts);

} // namespace cubelm::tp
