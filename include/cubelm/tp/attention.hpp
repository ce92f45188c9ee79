#pragma once
/// \file
/// \brief Causal self-attention on the block kernels (kernels/attention_blocks.hpp), the
/// attention of every layout: no T x T score matrix is kept, a layer saves only the
/// log-sum-exp of its query rows for its backward (docs/model.md, "Attention").
///
/// Each sequence's tokens on a rank are cut into blocks (tp::attention_blocks). A query
/// block runs against every key/value block at or before it, the partial results merged by
/// their log-sum-exp; backward recomputes each block pair's probabilities from it
/// (FlashAttention's backward). Queries, outputs and gradients stay token-major [rows, heads
/// x d] like the rest of the model; the blocks are head-major copies.
///
/// With context parallelism (docs/grid.md, "Context parallelism") each of the cp ranks of
/// the group holds 2 of the 2 cp equal chunks of every sequence, chunk c and chunk 2 cp - 1 -
/// c (kernels::Positions), so that every rank has the same share of the causal mask's work.
/// Forward all-gathers the keys and values of the group's chunks; backward all-gathers them
/// again (nothing of the gathered blocks is kept between passes), adds each block pair's
/// share of dq, dk and dv, and reduce-scatters the keys' and values' gradients back to the
/// ranks that own them.

#include "cubelm/comm/group.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::tp {

/// \brief The attention of one rank, for micro-batches of `sequences` sequences of which it
/// holds `local` tokens each, `heads` heads of `head_dim`; `group`: the context-parallel
/// group, or null (no context parallelism: whole sequences here). Its buffers are shared by
/// every layer (tp::attention_buffers describes them, and the constructor checks what it
/// allocated against that); what a layer's forward saves lives in `saved` (make_saved).
template <class T>
class BlockAttention {
public:
  /// The type attention computes in and its buffers hold: float for a bf16 model, whose
  /// q, k, v and outputs are copied into float blocks (kernels/attention_blocks.hpp).
  using G = compute_t<T>;
  BlockAttention(const comm::Group* group, int sequences, int heads, int local, int head_dim);

  /// \brief What a layer's forward saves for its backward: the log-sum-exp of every query
  /// row, [blocks here, sequences x heads, block length] (tp::attention_saved).
  kernels::Batch<G> make_saved() const;
  /// \brief Bytes of the buffers shared by the layers.
  std::int64_t bytes() const { return bytes_; }

  /// \brief out [rows, heads x d] = causal attention of the local queries q over the keys
  /// and values of the whole sequences (k, v: the local ones; rows = sequences x local).
  void forward(const ExecSpace& exec, const kernels::Mat<T>& q, const kernels::Mat<T>& k,
               const kernels::Mat<T>& v, const kernels::Batch<G>& saved,
               const kernels::Mat<T>& out) const;
  /// \brief dq, dk, dv (assigned) from dout, with `out` and `saved` those of the forward.
  void backward(const ExecSpace& exec, const kernels::Mat<T>& q, const kernels::Mat<T>& k,
                const kernels::Mat<T>& v, const kernels::Mat<T>& out,
                const kernels::Batch<G>& saved, const kernels::Mat<T>& dout,
                const kernels::Mat<T>& dq, const kernels::Mat<T>& dk,
                const kernels::Mat<T>& dv) const;

private:
  // Copies this rank's key and value blocks head-major and, with context parallelism,
  // all-gathers them over the group.
  void gather_keys(const ExecSpace& exec, const kernels::Mat<T>& k, const kernels::Mat<T>& v) const;
  // The block of all_ (or of a buffer shaped like it) holding global block g's keys (kv 0)
  // or values (kv 1).
  kernels::Batch<G> block(const kernels::Tensor4<G>& blocks, int g, int kv) const;
  // The global block index of local block j.
  int mine(int j) const;

  const comm::Group* group_; // null without context parallelism
  int cp_, rank_, heads_, per_rank_;
  std::int64_t n_, chunk_, d_, bytes_ = 0;
  // mine_ [2 b, n, chunk, d]: this rank's b key blocks, then its value blocks; all_ and
  // dall_ [2 b cp, n, chunk, d]: every rank's, in rank order (mine_ and dmine_ themselves
  // on one rank); dmine_: the reduced gradients.
  kernels::Tensor4<G> mine_, all_, dall_, dmine_;
  // One query block's: q, the output, a partial output, dout, dq; scores.
  kernels::Batch<G> q_, o_, part_, dout_, dq_, scores_, dscores_;
  kernels::Mat<G> part_lse_, delta_;
  // A bf16 model with context parallelism: the key and value blocks (and their gradients)
  // as sent and received, in bf16.
  kernels::Vec<T> sent_, received_;
};

} // namespace cubelm::tp
