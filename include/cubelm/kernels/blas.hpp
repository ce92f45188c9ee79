#pragma once
/// \file
/// \brief Dense linear algebra: the one place cubelm calls Kokkos Kernels' gemm.

#include "cubelm/kernels/views.hpp"

#include <string>

namespace cubelm::kernels {

/// \brief C = alpha op(A) op(B) + beta C, op = transpose when the flag is set.
///
/// Dispatches to the vendor BLAS (OpenBLAS, cuBLAS) through Kokkos Kernels, on
/// `exec` where Kokkos Kernels takes an execution space instance (3.6 and later);
/// Kokkos Kernels 3.4 and 3.5 run it on the default instance (core/compat.hpp).
template <class T>
void gemm(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const Mat<T>& a,
          const Mat<T>& b, T beta, const Mat<T>& c);

/// \brief A stack of `count` row-major matrices [count, rows, cols], one after the other.
template <class T>
using Batch = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace>;

/// \brief C_i = alpha op(A_i) op(B_i) + beta C_i for every matrix i of the batch.
///
/// One strided-batched product: cublas{S,D}gemmStridedBatched on `exec`'s stream in
/// CUDA builds (cublasGemmStridedBatchedEx in bf16), and on CPUs the matrices spread
/// over the threads, one single-threaded BLAS product each (or one after the other on
/// all threads when there are fewer matrices than threads). Follows the gemm precision
/// (kernels/precision.hpp) like gemm.
template <class T>
void gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const Batch<T>& a,
                  const Batch<T>& b, T beta, const Batch<T>& c);

/// \brief How the BLAS linked in runs its threads: "OpenBLAS 0.3.21, OpenMP threads",
/// "... pthreads", "... sequential", or "not OpenBLAS" (asked at run time, so it names
/// the library really loaded).
std::string blas_threading();

/// \brief True when the BLAS uses threads of its own (OpenBLAS' pthreads build): with
/// more than one Kokkos thread they compete with Kokkos' for the cores.
bool blas_has_own_threads();

/// \brief The single-precision gemm rate of this device in GFLOP/s (512^3 products,
/// repeated for at least 0.2 s): the peak `cubelm train` reports MFU against.
double measure_gemm_gflops();

} // namespace cubelm::kernels
