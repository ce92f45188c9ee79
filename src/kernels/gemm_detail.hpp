#pragma once
// The pieces the gemm paths share (blas.cpp, batched.cpp, precision.cpp): the
// shape of a batched product, the CPU batched product, and the bf16 products.
// Internal to src/kernels.

#include "cubelm/kernels/blas.hpp"

#include <cstddef>
#include <string>

namespace cubelm::kernels::detail {

/// The BLAS arguments of a row-major batched product C_i = op(A_i) op(B_i): sizes,
/// leading dimensions (the row lengths) and the distance between matrices.
struct BatchShape {
  int count = 0, m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
};

/// The shape of a batched product of [count, rows, cols] extents; checks that they agree.
BatchShape batch_shape(bool trans_a, bool trans_b, const std::size_t a[3], const std::size_t b[3],
                       const std::size_t c[3]);

/// A Kokkos Tools region around one product: the products of cuBLAS and of the host
/// BLAS are not Kokkos kernels, and a profiling tool sees them only in a region
/// (docs/kernels.md, "Timing kernels"). Without a tool loaded it costs a test of a
/// null callback; `name` is a static string, so nothing is allocated per product.
class ProfileRegion {
public:
  explicit ProfileRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ProfileRegion() { Kokkos::Profiling::popRegion(); }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;
};

/// KokkosBlas::gemm, on `exec` where Kokkos Kernels allows it (core/compat.hpp).
template <class T>
void vendor_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const Mat<T>& a,
                 const Mat<T>& b, T beta, const Mat<T>& c);

#ifndef KOKKOS_ENABLE_CUDA
/// C = alpha op(A) op(B) + beta C on row-major matrices with leading dimensions lda, ldb,
/// ldc, one BLAS call on the calling thread's BLAS threads (CPUs).
template <class T>
void host_gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc);

/// The batched product on CPUs, on contiguous batches of shape `s`.
template <class T>
void host_gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const T* a,
                       const T* b, T beta, T* c, const BatchShape& s);
#endif

/// C = alpha op(A) op(B) + beta C with A and B rounded to bfloat16 and fp32
/// accumulation. Shapes are checked by the caller.
void bf16_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha, const Mat<float>& a,
               const Mat<float>& b, float beta, const Mat<float>& c);

/// F(TA, TB, TC) for every product of a bf16 model that kernels::gemm instantiates:
/// activations and weight copies in bf16, weight gradients and the router's float
/// outputs in float.
#define CUBELM_FOR_EACH_BF16_GEMM(F)                                                               \
  F(bf16, bf16, bf16)                                                                              \
  F(bf16, bf16, float)                                                                             \
  F(float, bf16, bf16)                                                                             \
  F(bf16, float, bf16)                                                                             \
  F(float, bf16, float)                                                                            \
  F(bf16, float, float)

/// C = alpha op(A) op(B) + beta C with a bf16 matrix among A, B and C (kernels::gemm):
/// bfloat16 inputs (float ones rounded), float accumulation, C stored as TC. Shapes are
/// checked by the caller; k > 0.
template <class TA, class TB, class TC>
void bf16_storage_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha,
                       const Mat<TA>& a, const Mat<TB>& b, float beta, const Mat<TC>& c);

/// The same for every matrix of a batch of shape `s` (checked by the caller).
void bf16_gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha,
                       const Batch<float>& a, const Batch<float>& b, float beta,
                       const Batch<float>& c, const BatchShape& s);

} // namespace cubelm::kernels::detail
