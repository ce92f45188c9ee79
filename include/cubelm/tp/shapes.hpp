#pragma once
/// \file
/// \brief The shapes a tensor-parallel mode can split: every rank must hold whole
/// heads, whole sequences and equal blocks of each tensor (docs/tensor-parallel.md).
///
/// One rule for everyone: the deck reports it with the key to change, the model
/// checks it before it asks its mode for layers. Pure arithmetic, no Kokkos.

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/config.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace cubelm::tp {

/// \brief The vocabulary rows the layout splits: p in 1d, q^2 in 2d and 3d, 1 without
/// tensor parallelism.
std::int64_t vocab_split(const comm::Layout& layout);

/// \brief How a tensor mode splits a micro-batch's activations over its ranks: each holds
/// 1 / `sequences` of the sequences, 1 / `outer` of the residual stream's features
/// ("outer", what a LayerNorm reads), 1 / `inner` of the features inside a linear pair
/// (q, k, v, the MLP's hidden layer), 1 / `heads` of the attention heads, and with
/// sequence parallelism 1 / `stream_rows` of the residual stream's rows.
///  - 1d (p ranks): sequences 1, outer 1, inner p, heads p, stream_rows p with sequence
///    parallelism (else 1);
///  - 2d (q x q): sequences q, outer q, inner q, heads q;
///  - 3d (q x q x q): sequences q^2, outer q, inner q, heads q.
/// The runtime modes (tp::Mode) and the closed forms (memory, traffic) read it.
struct ActivationSplit {
  int sequences = 1, outer = 1, inner = 1, heads = 1, stream_rows = 1;
};
ActivationSplit activation_split(const comm::Layout& layout);

/// \brief How a tensor mode splits the model's parameters over its ranks: each holds
/// 1 / `matrix` of a weight matrix (wte with the padded vocabulary's rows), 1 / `vector`
/// of a LayerNorm's vectors and of the biases, but 1 / `column_bias` of the biases of a
/// pair's first linear (bq, bk, bv, b1), and 1 / `wpe` of wpe. An MoE layer's router and
/// experts are not the mode's (whole, or their hidden layer split by expert tensor
/// parallelism).
///  - 1d (p ranks): matrix p, column_bias p, vector 1, wpe 1 (LayerNorms, bo, b2, wpe
///    replicated);
///  - 2d (q x q): matrix q^2, column_bias and vector q^2, wpe q (a hidden block,
///    replicated over the column);
///  - 3d (q x q x q): matrix q^3, column_bias and vector q, wpe q (a feature chunk,
///    replicated over a plane).
struct ParamSplit {
  int matrix = 1, column_bias = 1, vector = 1, wpe = 1;
};
ParamSplit param_split(const comm::Layout& layout);

/// \brief The padded vocabulary the model computes with: the smallest multiple of both
/// model.vocab_divisible_by and vocab_split(layout) that holds model.vocab_size. The
/// rows past vocab_size are zero, never predicted (masked out of the softmax and the
/// loss) and never stored in checkpoints (docs/model.md).
std::int64_t padded_vocab(const ModelConfig& model, const comm::Layout& layout);

/// \brief How a rank's attention cuts the `local` tokens it holds of each sequence into the
/// blocks its kernels run on (tp::BlockAttention): with context parallelism (cp > 1) its two
/// chunks of the 2 cp (kernels::Positions); on one rank, blocks of at least 128 tokens,
/// halved while the halves are whole and that long (one block for under 256 or an odd count).
struct AttentionBlocks {
  int per_rank = 1;        ///< blocks of each sequence on this rank
  std::int64_t length = 0; ///< tokens of a block
};
AttentionBlocks attention_blocks(int cp, std::int64_t local);

/// \brief The first rule `layout`'s tensor mode breaks for `model` with micro-batches of
/// `micro` sequences, naming the deck key (e.g. "model.heads = 6 divisible by 4 (whole
/// heads per rank)"), or "" when the model splits evenly. `layout` must be valid. The
/// vocabulary always splits (it is padded).
///  - 1d (p ranks): heads and 4 x hidden divisible by p; with sequence parallelism the
///    micro-batch's tokens too;
///  - 2d (q x q): the micro-batch and heads by q; hidden and 4 x hidden by q^2;
///  - 3d (q x q x q): the micro-batch by q^2, heads by q; hidden and 4 x hidden by q^2.
std::string check_shapes(const comm::Layout& layout, const ModelConfig& model, int micro);

/// \brief Pairs each expert keeps of `tokens` tokens: ceil(capacity_factor tokens k / E),
/// or -1 (all of them) when capacity_factor is 0 (dropless).
inline std::int64_t moe_capacity(double capacity_factor, std::int64_t tokens, int k, int experts) {
  if (capacity_factor <= 0)
    return -1;
  return static_cast<std::int64_t>(
      std::ceil(capacity_factor * static_cast<double>(tokens) * k / experts));
}

/// \brief Rows of the expert buffers for `tokens` tokens: every pair (tokens k) when
/// dropless, else at most E x capacity.
inline std::int64_t moe_rows(double capacity_factor, std::int64_t tokens, int k, int experts) {
  const std::int64_t all = tokens * k, cap = moe_capacity(capacity_factor, tokens, k, experts);
  return cap < 0 || cap * experts >= all ? all : cap * experts;
}

/// \brief Rows the experts of one rank of an expert-parallel group of `ep` ranks may
/// receive for `tokens` tokens per rank: from each of the ep ranks, every pair (dropless)
/// or at most capacity rows for each of its experts / ep experts; moe_rows when ep = 1.
/// The buffers are sized for this worst case (every token of the group choosing this
/// rank's experts), so that no step allocates.
inline std::int64_t moe_received_rows(double capacity_factor, std::int64_t tokens, int k,
                                      int experts, int ep) {
  if (ep <= 1)
    return moe_rows(capacity_factor, tokens, k, experts);
  const std::int64_t all = tokens * k, cap = moe_capacity(capacity_factor, tokens, k, experts);
  const std::int64_t here = experts / ep;
  return ep * (cap < 0 || cap * here >= all ? all : cap * here);
}

} // namespace cubelm::tp
