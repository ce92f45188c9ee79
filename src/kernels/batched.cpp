// Batched products: cuBLAS' strided-batched gemm on GPUs; on CPUs the batch spread
// over the cores, one single-threaded BLAS product per matrix (OpenBLAS built for
// OpenMP runs on one thread inside a parallel region), or the products one after
// the other on all threads when the batch is smaller than the thread count.

#include "cubelm/kernels/blas.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/kernels/precision.hpp"

#include "gemm_detail.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include "cublas.hpp"
#else
#include <cblas.h>
#endif

#include <string>
#include <type_traits>

namespace cubelm::kernels {

namespace {

std::string shape(const char* name, std::size_t count, std::size_t rows, std::size_t cols) {
  return std::string(name) + " " + std::to_string(count) + " x " + std::to_string(rows) + "x" +
         std::to_string(cols);
}

} // namespace

namespace detail {

BatchShape batch_shape(bool trans_a, bool trans_b, const std::size_t a[3], const std::size_t b[3],
                       const std::size_t c[3]) {
  BatchShape s;
  s.count = static_cast<int>(c[0]);
  s.m = static_cast<int>(trans_a ? a[2] : a[1]);
  s.k = static_cast<int>(trans_a ? a[1] : a[2]);
  s.n = static_cast<int>(trans_b ? b[1] : b[2]);
  const std::size_t kb = trans_b ? b[2] : b[1];
  CUBELM_ASSERT(a[0] == c[0] && b[0] == c[0] && kb == static_cast<std::size_t>(s.k) &&
                    c[1] == static_cast<std::size_t>(s.m) && c[2] == static_cast<std::size_t>(s.n),
                "gemm_batched shapes: " + shape("A", a[0], a[1], a[2]) + ", " +
                    shape("B", b[0], b[1], b[2]) + ", " + shape("C", c[0], c[1], c[2]) +
                    (trans_a ? " (A transposed)" : "") + (trans_b ? " (B transposed)" : ""));
  s.lda = static_cast<int>(a[2]);
  s.ldb = static_cast<int>(b[2]);
  s.ldc = static_cast<int>(c[2]);
  s.stride_a = static_cast<long long>(a[1] * a[2]);
  s.stride_b = static_cast<long long>(b[1] * b[2]);
  s.stride_c = static_cast<long long>(c[1] * c[2]);
  return s;
}

#ifndef KOKKOS_ENABLE_CUDA

template <class T>
void host_gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void host_gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const T* a,
                       const T* b, T beta, T* c, const BatchShape& s) {
  auto product = [=](int i) {
    host_gemm<T>(trans_a, trans_b, s.m, s.n, s.k, alpha, a + i * s.stride_a, s.lda,
                 b + i * s.stride_b, s.ldb, beta, c + i * s.stride_c, s.ldc);
  };
  if (s.count >= exec.concurrency()) {
    // Host spaces run plain lambdas; each thread takes whole products.
    Kokkos::parallel_for("cubelm::gemm_batched", Kokkos::RangePolicy<ExecSpace>(exec, 0, s.count),
                         product);
  } else {
    exec.fence();
    for (int i = 0; i < s.count; ++i)
      product(i);
  }
}

template void host_gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*,
                               int, float, float*, int);
template void host_gemm<double>(bool, bool, int, int, int, double, const double*, int,
                                const double*, int, double, double*, int);
template void host_gemm_batched<float>(const ExecSpace&, bool, bool, float, const float*,
                                       const float*, float, float*, const BatchShape&);
template void host_gemm_batched<double>(const ExecSpace&, bool, bool, double, const double*,
                                        const double*, double, double*, const BatchShape&);

#endif

} // namespace detail

template <class T>
void gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const Batch<T>& a,
                  const Batch<T>& b, T beta, const Batch<T>& c) {
  const std::size_t ea[3] = {a.extent(0), a.extent(1), a.extent(2)};
  const std::size_t eb[3] = {b.extent(0), b.extent(1), b.extent(2)};
  const std::size_t ec[3] = {c.extent(0), c.extent(1), c.extent(2)};
  const detail::BatchShape s = detail::batch_shape(trans_a, trans_b, ea, eb, ec);
  if (s.count == 0 || s.m == 0 || s.n == 0)
    return;
  CUBELM_ASSERT(s.k > 0, "gemm_batched: products over an empty inner dimension");
  static const std::string region("cubelm::gemm_batched");
  const detail::ProfileRegion profile(region);
  if constexpr (std::is_same_v<T, float>)
    if (gemm_precision() == Precision::bf16) {
      detail::bf16_gemm_batched(exec, trans_a, trans_b, alpha, a, b, beta, c, s);
      return;
    }
#ifdef KOKKOS_ENABLE_CUDA
  const cublasHandle_t handle = detail::cublas_on(exec);
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  if constexpr (std::is_same_v<T, float>)
    detail::cublas_check(cublasSgemmStridedBatched(handle, tb, ta, s.n, s.m, s.k, &alpha, b.data(),
                                                   s.ldb, s.stride_b, a.data(), s.lda, s.stride_a,
                                                   &beta, c.data(), s.ldc, s.stride_c, s.count),
                         "cublasSgemmStridedBatched");
  else
    detail::cublas_check(cublasDgemmStridedBatched(handle, tb, ta, s.n, s.m, s.k, &alpha, b.data(),
                                                   s.ldb, s.stride_b, a.data(), s.lda, s.stride_a,
                                                   &beta, c.data(), s.ldc, s.stride_c, s.count),
                         "cublasDgemmStridedBatched");
#else
  detail::host_gemm_batched<T>(exec, trans_a, trans_b, alpha, a.data(), b.data(), beta, c.data(),
                               s);
#endif
}

template void gemm_batched<float>(const ExecSpace&, bool, bool, float, const Batch<float>&,
                                  const Batch<float>&, float, const Batch<float>&);
template void gemm_batched<double>(const ExecSpace&, bool, bool, double, const Batch<double>&,
                                   const Batch<double>&, double, const Batch<double>&);

} // namespace cubelm::kernels
