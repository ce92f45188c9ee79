#pragma once
/// \file
/// \brief Causal multi-head self-attention on q, k, v [N, H] (N = B sequences x T tokens).
///
/// Head h owns the contiguous feature columns [h*d, (h+1)*d), d = H / heads;
/// out = softmax(q k^T / sqrt(d), causal) v per sequence and head. Each product
/// is one batched gemm over every (sequence, head) on head-major copies of q, k, v
/// (kernels::gemm_batched), so attention goes at the speed of the vendor BLAS; the
/// softmax rows are one team per row. On CPUs each thread takes whole (sequence, head)
/// pairs instead, products and rows together (docs/kernels.md).

#include "cubelm/kernels/views.hpp"

namespace cubelm::kernels {

/// \brief Head-major buffers [B * heads, T, d], allocated once per model.
template <class T>
struct AttentionWorkspace {
  Kokkos::View<T***, Kokkos::LayoutRight, MemSpace> q, k, v, o;
  AttentionWorkspace() = default;
  AttentionWorkspace(int batch, int heads, int seq, int head_dim);
};

/// \brief out = attention(q, k, v); keeps the probabilities [B, heads, T, T] for backward.
template <class T>
void attention_forward(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                       int heads, const Tensor4<T>& probs, const AttentionWorkspace<T>& work,
                       const Mat<T>& out);

/// \brief dq, dk, dv (assigned) from dout; `scratch` has the shape of `probs`.
template <class T>
void attention_backward(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                        int heads, const Tensor4<T>& probs, const Mat<T>& dout,
                        const Tensor4<T>& scratch, const AttentionWorkspace<T>& work,
                        const Mat<T>& dq, const Mat<T>& dk, const Mat<T>& dv);

/// \brief On CPUs, whether attention may run one (sequence, head) pair at a time on each
/// thread, products and softmax rows together (the default, docs/kernels.md), or must
/// take the separate passes (batched products, then the softmax rows). Both compute
/// the same bits; tests and benchmarks compare them. No effect on GPUs.
void set_attention_by_pair(bool allowed);

} // namespace cubelm::kernels
