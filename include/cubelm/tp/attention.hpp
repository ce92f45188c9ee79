#pragma once
/// \file
/// \brief Causal self-attention with the sequence split over the ranks of a group
/// (context parallelism; docs/grid.md, "Context parallelism").
///
/// Each of the cp ranks holds 2 of the 2 cp equal chunks of every sequence, chunk c and
/// chunk 2 cp - 1 - c (kernels::Positions): every rank then has the same share of the
/// causal mask's work. Forward all-gathers the keys and values of the group's chunks and
/// runs each local query chunk against the key chunks at or before it with the block
/// kernels (kernels/attention_blocks.hpp), merging the partial results by their
/// log-sum-exp; it saves that log-sum-exp. Backward all-gathers the keys and values again
/// (nothing of the gathered blocks is kept between passes), adds each block pair's share
/// of dq, dk and dv, and reduce-scatters the keys' and values' gradients back to the
/// ranks that own them. Queries, outputs and gradients stay token-major [rows, heads x d]
/// like the rest of the model; the blocks are head-major copies.

#include "cubelm/comm/group.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::tp {

/// \brief The attention of one rank of a context-parallel group, for micro-batches of
/// `sequences` sequences of which it holds `local` tokens each, `heads` heads of `head_dim`.
/// Its buffers are shared by every layer (tp::context_attention_buffers describes them, and
/// the constructor checks what it allocated against that); what a pass saves lives in
/// `saved` (make_saved).
template <class T>
class ContextAttention {
public:
  ContextAttention(const comm::Group& group, int sequences, int heads, int local, int head_dim);

  /// \brief What a layer's forward saves for its backward: the log-sum-exp of every query
  /// row, [2, sequences x heads, local / 2] (one block per local chunk).
  kernels::Batch<T> make_saved() const;
  /// \brief Bytes of one make_saved().
  std::int64_t saved_bytes() const;
  /// \brief Bytes of the buffers shared by the layers.
  std::int64_t bytes() const;

  /// \brief out [rows, heads x d] = causal attention of the local queries q over the keys
  /// and values of the whole sequences (k, v: the local ones; rows = sequences x local).
  void forward(const ExecSpace& exec, const kernels::Mat<T>& q, const kernels::Mat<T>& k,
               const kernels::Mat<T>& v, const kernels::Batch<T>& saved,
               const kernels::Mat<T>& out) const;
  /// \brief dq, dk, dv (assigned) from dout, with `out` and `saved` those of the forward.
  void backward(const ExecSpace& exec, const kernels::Mat<T>& q, const kernels::Mat<T>& k,
                const kernels::Mat<T>& v, const kernels::Mat<T>& out,
                const kernels::Batch<T>& saved, const kernels::Mat<T>& dout,
                const kernels::Mat<T>& dq, const kernels::Mat<T>& dk,
                const kernels::Mat<T>& dv) const;

private:
  // Gathers this rank's key and value chunks and all-gathers them over the group.
  void gather_keys(const ExecSpace& exec, const kernels::Mat<T>& k, const kernels::Mat<T>& v) const;
  // The block of all_ (or of a buffer shaped like it) holding chunk g's keys (kv 0) or
  // values (kv 1).
  kernels::Batch<T> block(const kernels::Tensor4<T>& blocks, int g, int kv) const;
  // The global chunk index of local chunk j (0 or 1).
  int mine(int j) const { return j == 0 ? rank_ : 2 * cp_ - 1 - rank_; }

  const comm::Group& group_;
  int cp_, rank_, heads_;
  std::int64_t n_, chunk_, d_;
  // mine_ [4, n, chunk, d]: this rank's keys (chunks 0, 1) then values; all_ and dall_
  // [4 cp, n, chunk, d]: every rank's, in rank order; dmine_: the reduced gradients.
  kernels::Tensor4<T> mine_, all_, dall_, dmine_;
  // One query chunk's blocks: q, the output, a partial output, dout, dq; scores.
  kernels::Batch<T> q_, o_, part_, dout_, dq_, scores_, dscores_;
  kernels::Mat<T> part_lse_, delta_;
};

} // namespace cubelm::tp
