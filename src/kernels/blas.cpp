#include "cubelm/kernels/blas.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/kernels/precision.hpp"

#include "gemm_detail.hpp"
#include "ranges.hpp"

#include <KokkosBlas3_gemm.hpp>

#include <dlfcn.h>

#include <string>
#include <type_traits>

namespace cubelm::kernels {

template <class TA, class TB, class TC>
void gemm(const ExecSpace& exec, bool trans_a, bool trans_b, compute_t<TC> alpha, const Mat<TA>& a,
          const Mat<TB>& b, compute_t<TC> beta, const Mat<TC>& c) {
  using C = compute_t<TC>;
  const auto m = trans_a ? a.extent(1) : a.extent(0);
  const auto k = trans_a ? a.extent(0) : a.extent(1);
  const auto kb = trans_b ? b.extent(1) : b.extent(0);
  const auto n = trans_b ? b.extent(0) : b.extent(1);
  CUBELM_ASSERT(k == kb && c.extent(0) == m && c.extent(1) == n,
                "gemm shapes: op(A) " + std::to_string(m) + "x" + std::to_string(k) + ", op(B) " +
                    std::to_string(kb) + "x" + std::to_string(n) + ", C " +
                    std::to_string(c.extent(0)) + "x" + std::to_string(c.extent(1)));
  if (m == 0 || n == 0)
    return;
  if (k == 0) { // BLAS would still scale C; do it explicitly for clarity
    const Mat<TC> cc = c;
    for_each_element(
        "cubelm::gemm_scale", exec, static_cast<std::int64_t>(m), static_cast<std::int64_t>(n),
        KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
          cc(i, j) = C(cc(i, j)) * beta;
        });
    return;
  }
  static const std::string region("cubelm::gemm");
  const detail::ProfileRegion profile(region);
  if constexpr (std::is_same_v<TA, TB> && std::is_same_v<TA, TC> && !std::is_same_v<TA, bf16>) {
    if constexpr (std::is_same_v<TA, float>)
      if (gemm_precision() == Precision::bf16) {
        detail::bf16_gemm(exec, trans_a, trans_b, alpha, a, b, beta, c);
        return;
      }
    detail::vendor_gemm(exec, trans_a, trans_b, alpha, a, b, beta, c);
  } else {
    detail::bf16_storage_gemm(exec, trans_a, trans_b, alpha, a, b, beta, c);
  }
}

template <class T>
void detail::vendor_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha,
                         const Mat<T>& a, const Mat<T>& b, T beta, const Mat<T>& c) {
#if CUBELM_KOKKOSBLAS_GEMM_ON_INSTANCE
  KokkosBlas::gemm(exec, trans_a ? "T" : "N", trans_b ? "T" : "N", alpha, a, b, beta, c);
#else
  (void)exec;
  KokkosBlas::gemm(trans_a ? "T" : "N", trans_b ? "T" : "N", alpha, a, b, beta, c);
#endif
}

#define CUBELM_INSTANTIATE_GEMM(TA, TB, TC)                                                        \
  template void gemm<TA, TB, TC>(const ExecSpace&, bool, bool, compute_t<TC>, const Mat<TA>&,      \
                                 const Mat<TB>&, compute_t<TC>, const Mat<TC>&);
CUBELM_INSTANTIATE_GEMM(float, float, float)
CUBELM_INSTANTIATE_GEMM(double, double, double)
CUBELM_FOR_EACH_BF16_GEMM(CUBELM_INSTANTIATE_GEMM)
template void detail::vendor_gemm<float>(const ExecSpace&, bool, bool, float, const Mat<float>&,
                                         const Mat<float>&, float, const Mat<float>&);
template void detail::vendor_gemm<double>(const ExecSpace&, bool, bool, double, const Mat<double>&,
                                          const Mat<double>&, double, const Mat<double>&);

namespace {

// OpenBLAS' own queries, looked up in the process so that a BLAS without them links too.
int openblas_parallel() {
  using Fn = int (*)();
  const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  return fn ? fn() : -1;
}

} // namespace

std::string blas_threading() {
  const int parallel = openblas_parallel();
  if (parallel < 0)
    return "not OpenBLAS";
  const std::string name = blas_kernels().library;
  return (name.empty() ? "OpenBLAS" : name) + (parallel == 2   ? ", OpenMP threads"
                                               : parallel == 1 ? ", pthreads"
                                                               : ", sequential");
}

bool blas_has_own_threads() {
  return openblas_parallel() == 1;
}

} // namespace cubelm::kernels
