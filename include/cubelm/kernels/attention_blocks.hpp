#pragma once
/// \file
/// \brief Causal attention over blocks of the sequence: one (query block, key/value block)
/// pair at a time, partial results merged by their log-sum-exp.
///
/// The pieces a layer needs when the sequence is split into chunks (context
/// parallelism: chunks on different ranks, key/value blocks passed around a ring or
/// gathered); the kernels themselves know only global token positions. A block is a
/// head-major batch [B * heads, len, d] (the layout of AttentionWorkspace) holding the
/// tokens at global positions [offset, offset + len) of every sequence. Query t of a
/// block at q_offset sees key s of a block at k_offset when k_offset + s <= q_offset + t.
///
/// Forward: for each key/value block, attention_block_forward gives the block's own
/// softmax output and the log-sum-exp of its visible scores per query row;
/// attention_combine merges two such partial results exactly (in real arithmetic).
/// Backward (as in FlashAttention): attention_block_delta once per query block from the
/// final output, then attention_block_backward per block pair, recomputing the
/// probabilities from the final log-sum-exp and adding that pair's share of dq, dk and
/// dv. docs/kernels.md, "Attention over blocks of the sequence".

#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::kernels {

/// \brief How the causal mask meets a block pair.
enum class BlockMask {
  skip,    ///< every key is after every query: the pair contributes nothing
  partial, ///< some keys are hidden from some queries (a block on the diagonal)
  full,    ///< every key is at or before every query: no mask
};

/// \brief The mask of queries [q_offset, q_offset + q_len) against keys [k_offset,
/// k_offset + k_len). A pair with an empty block is `skip`.
BlockMask block_mask(std::int64_t q_offset, std::int64_t q_len, std::int64_t k_offset,
                     std::int64_t k_len);

/// \brief Partial attention of the query block q [n, Tq, d] over one key/value block k, v
/// [n, Tk, d] (n = B * heads): out [n, Tq, d] = softmax over the visible keys of
/// q k^T / sqrt(d), times v; lse [n, Tq] = log of the sum of exp(score) over the visible
/// keys. A row that sees no key gets out = 0 and lse = -inf (a skipped pair: every row).
/// `scores` [n, Tq, Tk] is scratch (it ends holding the block's probabilities, 0 where
/// masked). Returns the pair's mask; for `skip` nothing but the fill of out and lse runs.
template <class T>
BlockMask attention_block_forward(const ExecSpace& exec, const Batch<T>& q, const Batch<T>& k,
                                  const Batch<T>& v, std::int64_t q_offset, std::int64_t k_offset,
                                  const Batch<T>& scores, const Batch<T>& out, const Mat<T>& lse);

/// \brief Merges the partial result (out_b, lse_b) into (out_a, lse_a), both over the same
/// queries and disjoint sets of keys: with m = max(lse_a, lse_b), w_x = exp(lse_x - m),
/// out_a = (w_a out_a + w_b out_b) / (w_a + w_b) and lse_a = m + log(w_a + w_b). Rows
/// where both are -inf stay (0, -inf); merging in a (0, -inf) row changes nothing.
template <class T>
void attention_combine(const ExecSpace& exec, const Batch<T>& out_a, const Mat<T>& lse_a,
                       const Batch<T>& out_b, const Mat<T>& lse_b);

/// \brief delta [n, Tq] = the row sums of dout * out over the final (combined) output
/// of a query block: once per query block, before its attention_block_backward calls.
template <class T>
void attention_block_delta(const ExecSpace& exec, const Batch<T>& out, const Batch<T>& dout,
                           const Mat<T>& delta);

/// \brief One block pair's share of the gradients, added to dq [n, Tq, d], dk and dv
/// [n, Tk, d]: with P = exp(q k^T / sqrt(d) - lse) on the visible keys (lse the final
/// log-sum-exp of the query rows over all keys), dv += P^T dout, dS = P (dout v^T -
/// delta), dq += dS k / sqrt(d), dk += dS^T q / sqrt(d). Summed over every key block of a
/// query block, and over every query block of a key block, these are the gradients of the
/// whole causal attention. `probs` and `dscores` [n, Tq, Tk] are scratch. A skipped pair
/// returns at once. Returns the pair's mask.
template <class T>
BlockMask attention_block_backward(const ExecSpace& exec, const Batch<T>& q, const Batch<T>& k,
                                   const Batch<T>& v, const Batch<T>& dout, const Mat<T>& lse,
                                   const Mat<T>& delta, std::int64_t q_offset,
                                   std::int64_t k_offset, const Batch<T>& probs,
                                   const Batch<T>& dscores, const Batch<T>& dq, const Batch<T>& dk,
                                   const Batch<T>& dv);

/// \brief Copies positions [t_begin, t_begin + len) of every sequence of the token-major
/// src [B * seq, heads * d] into the head-major block dst [B * heads, len, d]:
/// dst(b * heads + h, t, j) = src(b * seq + t_begin + t, h * d + j), B = dst.extent(0) / heads.
/// The blocks are compute_t<T> whatever src stores (a bf16 model's attention computes on
/// float blocks: the block pairs above run on float and double only).
template <class T>
void gather_heads(const ExecSpace& exec, const Mat<T>& src, int heads, std::int64_t t_begin,
                  const Batch<compute_t<T>>& dst);

/// \brief The inverse of gather_heads: writes (or, with `accumulate`, adds) the block src
/// [B * heads, len, d] into positions [t_begin, t_begin + len) of every sequence of dst
/// (rounded to T where it stores).
template <class T>
void scatter_heads(const ExecSpace& exec, const Batch<compute_t<T>>& src, int heads,
                   std::int64_t t_begin, const Mat<T>& dst, bool accumulate = false);

} // namespace cubelm::kernels
