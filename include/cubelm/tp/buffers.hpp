#pragma once
/// \file
/// \brief The buffers of the tensor modes, described once and without Kokkos.
///
/// Each part a mode builds on a rank (a linear, a LayerNorm, the embedding's lookup and
/// head) asks for two kinds of buffers by name:
///  - scratch ("2d/act", "3d/weight_block", ...): one buffer shared by every part of the
///    mode on the rank, sized to the largest request (tp::Mode's workspace). The modes
///    reserve exactly these requests;
///  - its own ("ln/sums", "vector/partial", "head/logits", ...): each part keeps a set,
///    allocated when the mode builds it. After building a stage the model compares what
///    the mode allocated with stage_owned_sizes() (tp::Mode::check_buffers), name by name, so
///    that the description cannot drift from the runtime for any layout a run uses.
/// The memory estimate (cost/shape.hpp) sums the same descriptions: stage_scratch_sizes() and
/// stage_owned_sizes() enumerate a stage's parts as the model builds them.

#include "cubelm/comm/layout.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace cubelm::tp {

/// \brief What a buffer's elements are: values of the model's storage type (activations,
/// weights: 2 bytes in a bf16 model), values of its compute type (compute_t: statistics,
/// loss rows, gradients and attention's blocks, float in a bf16 model), token ids (32-bit
/// integers) or sums kept in double precision.
enum class Holds { values, compute, ids, sums };

/// \brief One buffer a part asks for: `elements` of what it `holds`.
struct Buffer {
  std::string_view name;
  std::int64_t elements = 0;
  Holds holds = Holds::values;
};
using Buffers = std::vector<Buffer>;

/// \brief A linear of `in` x `out` features over `rows` rows (as tp::Mode::linear gets
/// them); `second`: the second linear of a pair (Role::second).
Buffers linear_scratch(const comm::Layout& layout, std::int64_t in, std::int64_t out,
                       std::int64_t rows, bool second);
/// \brief A LayerNorm of `features` over `rows` rows (tp::Mode::layernorm).
Buffers layernorm_scratch(const comm::Layout& layout, std::int64_t features, std::int64_t rows);
/// \brief The embedding (tp::Mode::embedding) of `batch` sequences of `positions` tokens
/// here, `hidden` features and a `padded` vocabulary, with its lookup and/or its head.
Buffers embedding_scratch(const comm::Layout& layout, bool lookup, bool head, int batch,
                          std::int64_t positions, std::int64_t hidden, std::int64_t padded);

/// \brief The buffers a linear keeps for its `biases` biases of `out` features each
/// (their gathered blocks and partial gradients, by the mode's sharing of vectors).
Buffers linear_owned(const comm::Layout& layout, std::int64_t out, int biases, bool second);
/// \brief A LayerNorm's: its backward row sums and its gamma's and beta's buffers.
Buffers layernorm_owned(const comm::Layout& layout, std::int64_t features, std::int64_t rows);
/// \brief The embedding's (arguments as embedding_scratch; `seq_len` tokens of a whole
/// sequence, wpe's rows): the lookup's token ids and wpe's partial gradient, the head's
/// logits and cross-entropy rows, and the gathered blocks of wte that the 3d mode keeps for
/// either end.
Buffers embedding_owned(const comm::Layout& layout, bool lookup, bool head, int batch,
                        std::int64_t positions, std::int64_t seq_len, std::int64_t hidden,
                        std::int64_t padded);

/// \brief An MoE feed-forward (tp::Mode::moe) over the mode's `rows` rows of a micro-batch,
/// `hidden` features wide.
struct MoeParts {
  std::int64_t rows = 0, hidden = 0;
  int experts = 2, top_k = 2;
  double capacity_factor = 0; ///< 0: dropless
};
/// \brief Its scratch, as the layout arranges it (src/tp/moe.cpp): the router's and
/// dispatch's over the rows it routes (its share of the tensor group's, or the group's
/// with expert tensor parallelism), and the buffers of the wrapper that shares the rows.
Buffers moe_scratch(const comm::Layout& layout, const MoeParts& moe);
/// \brief Its own: the router's sort keys and probability means, and its partial
/// gradient when the tensor ranks share the router.
Buffers moe_owned(const comm::Layout& layout, const MoeParts& moe);

/// \brief What it saves of a micro-batch for its backward (kernels::MoeSaved): the routing
/// of the rows it routes, and its experts' activations of the rows they run on.
Buffers moe_saved(const comm::Layout& layout, const MoeParts& moe);

/// \brief The buffers attention (tp::BlockAttention) shares between a stage's layers, on
/// one of `cp` ranks holding `local` tokens of each of `sequences` sequences, `heads` heads
/// of `head_dim` here, in the blocks of tp::attention_blocks: key and value blocks (this
/// rank's and, with context parallelism, every rank's, and their gradients), one query
/// block's, its scores and row statistics.
/// With context parallelism in a model whose values are narrower than its compute type
/// (`value_bytes` 2: bf16), also the stored-type copies of this rank's and every rank's
/// key and value blocks, through which they travel (and their gradients after them).
Buffers attention_buffers(int cp, int sequences, int heads, int local, int head_dim,
                          int value_bytes = 4);
/// \brief What it saves of a micro-batch for its backward, per layer: the log-sum-exp of its
/// query rows (tp::BlockAttention::make_saved).
Buffers attention_saved(int cp, int sequences, int heads, int local);

/// \brief The parts of one pipeline stage, as the model builds them: per layer ln1, qkv
/// (three H -> H, first), proj (H -> H, second), ln2 and, in `layers - moe_layers` dense
/// layers, fc1 (H -> 4H, first) and fc2 (4H -> H, second), in the others an MoE
/// feed-forward; ln_f and the head on the last stage, the lookup on the first.
struct StageParts {
  int batch = 1;              ///< sequences per micro-batch
  std::int64_t positions = 1; ///< tokens of each sequence here
  std::int64_t seq_len = 1;   ///< tokens of a whole sequence (context parallelism: cp x positions)
  std::int64_t hidden = 1;
  std::int64_t padded_vocab = 1;
  int layers = 0, moe_layers = 0;
  bool first = true, last = true;
  int experts = 2, top_k = 2; ///< of the MoE layers
  double capacity_factor = 0; ///< of the MoE layers (0: dropless)
};

/// \brief A stage's buffers by name: the largest request per scratch name, or the sum of
/// every part's own buffers of a name.
using BufferSizes = std::map<std::string_view, Buffer>;
BufferSizes stage_scratch_sizes(const comm::Layout& layout, const StageParts& parts);
BufferSizes stage_owned_sizes(const comm::Layout& layout, const StageParts& parts);

/// \brief "" when `allocated` and `described` hold the same buffers, else the first
/// difference: "<name>: allocated N elements, described M".
std::string compare_buffers(const BufferSizes& allocated, const BufferSizes& described);

/// \brief Bytes of an element of the compute type of a storage type of `value_bytes`:
/// float for bf16 and float, double for double.
inline int compute_bytes(int value_bytes) {
  return value_bytes < 4 ? 4 : value_bytes;
}
/// \brief Bytes of `b` with values of `value_bytes` each.
inline std::int64_t bytes_of(const Buffer& b, int value_bytes) {
  switch (b.holds) {
  case Holds::values:
    return b.elements * value_bytes;
  case Holds::compute:
    return b.elements * compute_bytes(value_bytes);
  case Holds::ids:
    return b.elements * 4;
  case Holds::sums:
    break;
  }
  return b.elements * 8;
}
/// \brief Bytes of all of `sizes`, values of `value_bytes` each.
std::int64_t bytes_of(const BufferSizes& sizes, int value_bytes);
std::int64_t bytes_of(const Buffers& buffers, int value_bytes);

} // namespace cubelm::tp
