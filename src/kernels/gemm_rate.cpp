#include "cubelm/kernels/blas.hpp"

namespace cubelm::kernels {

double measure_gemm_gflops() {
  // A GPU needs a large product to reach its rate: at 512 launch and fence dominate.
  constexpr bool on_host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;
  const int n = on_host ? 512 : 4096;
  Mat<real> a("a", n, n), b("b", n, n), c("c", n, n);
  Kokkos::deep_copy(a, real(0.5));
  Kokkos::deep_copy(b, real(0.25));
  const ExecSpace exec;
  gemm<real>(exec, false, false, 1, a, b, 0, c); // warm-up
  exec.fence();
  Kokkos::Timer timer;
  int reps = 0;
  do {
    gemm<real>(exec, false, false, 1, a, b, 0, c);
    exec.fence();
    ++reps;
  } while (timer.seconds() < 0.2 || reps < 3);
  return 2.0 * n * n * static_cast<double>(n) * reps / timer.seconds() / 1e9;
}

} // namespace cubelm::kernels
