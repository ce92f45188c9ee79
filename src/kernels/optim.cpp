#include "cubelm/kernels/optim.hpp"

#include "cubelm/core/compat.hpp"

#include <cmath>

namespace cubelm::kernels {

namespace {
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
}

template <class T>
void adamw_update(const ExecSpace& exec, const AdamW& hp, const Vec<T>& p, const Vec<T>& g,
                  const Vec<T>& m, const Vec<T>& v) {
  // Scalars computed once on the host in double, as torch does with Python floats.
  const T decay = T(1.0 - hp.lr * hp.weight_decay);
  const T w1 = T(1.0 - hp.beta1), b2 = T(hp.beta2), w2 = T(1.0 - hp.beta2);
  const double bias1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bias2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const T step_size = T(hp.lr / bias1);
  const T bias2_sqrt = T(std::sqrt(bias2));
  const T eps = T(hp.eps);
  Kokkos::parallel_for(
      "cubelm::adamw", Range(exec, 0, p.extent(0)), KOKKOS_LAMBDA(const std::int64_t i) {
        const T grad = g(i);
        T param = p(i) * decay;
        // torch: exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 -
        // beta2)
        const T mi = m(i) + w1 * (grad - m(i));
        const T vi = v(i) * b2 + w2 * grad * grad;
        param -= step_size * mi / (kmath::sqrt(vi) / bias2_sqrt + eps);
        m(i) = mi;
        v(i) = vi;
        p(i) = param;
      });
}

template <class T>
double sum_squares(const ExecSpace& exec, const Vec<T>& x) {
  double total = 0;
  Kokkos::parallel_reduce(
      "cubelm::sum_squares", Range(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, double& acc) {
        acc += static_cast<double>(x(i)) * static_cast<double>(x(i));
      },
      total);
  return total;
}

template <class T>
double sum(const ExecSpace& exec, const Vec<T>& x) {
  double total = 0;
  Kokkos::parallel_reduce(
      "cubelm::sum", Range(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, double& acc) { acc += static_cast<double>(x(i)); },
      total);
  return total;
}

template <class T>
void scale(const ExecSpace& exec, const Vec<T>& x, T s) {
  Kokkos::parallel_for(
      "cubelm::scale", Range(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) { x(i) *= s; });
}

#define CUBELM_INSTANTIATE_OPTIM(T)                                                                \
  template void adamw_update<T>(const ExecSpace&, const AdamW&, const Vec<T>&, const Vec<T>&,      \
                                const Vec<T>&, const Vec<T>&);                                     \
  template double sum_squares<T>(const ExecSpace&, const Vec<T>&);                                 \
  template double sum<T>(const ExecSpace&, const Vec<T>&);                                         \
  template void scale<T>(const ExecSpace&, const Vec<T>&, T);

CUBELM_INSTANTIATE_OPTIM(float)
CUBELM_INSTANTIATE_OPTIM(double)

} // namespace cubelm::kernels
