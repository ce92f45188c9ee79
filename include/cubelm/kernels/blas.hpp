#pragma once
/// \file
/// \brief Dense linear algebra: the one place cubelm calls Kokkos Kernels' gemm.

#include "cubelm/kernels/views.hpp"

#include <string>

namespace cubelm::kernels {

/// \brief C = alpha op(A) op(B) + beta C, op = transpose when the flag is set.
///
/// Dispatches to the vendor BLAS (OpenBLAS, cuBLAS) through Kokkos Kernels.
/// Kokkos Kernels 3.4 has only gemm(transA, transB, alpha, A, B, beta, C) on
/// the default instance, so `exec` is fenced-by-ordering: the call is issued
/// after everything already queued on the default instance.
template <class T>
void gemm(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const Mat<T>& a,
          const Mat<T>& b, T beta, const Mat<T>& c);

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
