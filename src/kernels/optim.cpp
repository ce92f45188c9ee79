#include "cubelm/kernels/optim.hpp"

#include "cubelm/core/compat.hpp"

#include "ranges.hpp"

#include <cmath>
#include <type_traits>

namespace cubelm::kernels {

// Named, not anonymous: the exported adamw_update's kernel captures it (an anonymous
// type there draws -Wsubobject-linkage in a unity build).
namespace optim_detail {

// The scalars of one AdamW step, computed once on the host in double as torch does
// with Python floats.
template <class T>
struct AdamWStep {
  explicit AdamWStep(const AdamW& hp)
      : decay(T(1.0 - hp.lr * hp.weight_decay)), w1(T(1.0 - hp.beta1)), b2(T(hp.beta2)),
        w2(T(1.0 - hp.beta2)),
        step_size(T(hp.lr / (1.0 - std::pow(hp.beta1, static_cast<double>(hp.step))))),
        bias2_sqrt(T(std::sqrt(1.0 - std::pow(hp.beta2, static_cast<double>(hp.step))))),
        eps(T(hp.eps)) {}

  // torch: p *= 1 - lr wd; exp_avg.lerp_(grad, 1 - beta1);
  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2).
  KOKKOS_INLINE_FUNCTION void apply(T grad, T decay_factor, T& p, T& m, T& v) const {
    T param = p * decay_factor;
    const T mi = m + w1 * (grad - m);
    const T vi = v * b2 + w2 * grad * grad;
    param -= step_size * mi / (kmath::sqrt(vi) / bias2_sqrt + eps);
    m = mi;
    v = vi;
    p = param;
  }

  T decay, w1, b2, w2, step_size, bias2_sqrt, eps;
};

} // namespace optim_detail

template <class T>
void adamw_update(const ExecSpace& exec, const AdamW& hp, const Vec<T>& p, const Vec<T>& g,
                  const Vec<T>& m, const Vec<T>& v) {
  const optim_detail::AdamWStep<T> step(hp);
  Kokkos::parallel_for(
      "cubelm::adamw", Range(exec, 0, p.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) { step.apply(g(i), step.decay, p(i), m(i), v(i)); });
}

template <class T>
double sum_squares(const ExecSpace& exec, const OptimChunks& chunks, const Vec<T>& g) {
  double total = 0;
  Kokkos::parallel_reduce(
      "cubelm::sum_squares_chunks", per_row(exec, chunks.extent(0), kOptimChunk),
      KOKKOS_LAMBDA(const Member& team, double& acc) {
        const OptimChunk c = chunks(team.league_rank());
        if (!c.counted)
          return;
        const double part = team_sum<double>(team, 0, c.n, [&](const std::int64_t i) {
          const double x = static_cast<double>(g(c.first + i));
          return x * x;
        });
        team_once(team, [&]() { acc += part; });
      },
      total);
  return total;
}

template <class T>
void adamw_update(const ExecSpace& exec, const AdamW& hp, T clip, const OptimChunks& chunks,
                  const Vec<T>& p, const Vec<T>& g, const Vec<T>& m, const Vec<T>& v) {
  const optim_detail::AdamWStep<T> step(hp);
  Kokkos::parallel_for(
      "cubelm::adamw_chunks", per_row(exec, chunks.extent(0), kOptimChunk),
      KOKKOS_LAMBDA(const Member& team) {
        const OptimChunk c = chunks(team.league_rank());
        const T decay = c.decay ? step.decay : T(1);
        team_for(team, 0, c.n, [&](const std::int64_t i) {
          const std::int64_t k = c.first + i, j = c.moment_first + i;
          step.apply(g(k) * clip, decay, p(k), m(j), v(j));
        });
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
  template double sum_squares<T>(const ExecSpace&, const OptimChunks&, const Vec<T>&);             \
  template void adamw_update<T>(const ExecSpace&, const AdamW&, T, const OptimChunks&,             \
                                const Vec<T>&, const Vec<T>&, const Vec<T>&, const Vec<T>&);       \
  template double sum_squares<T>(const ExecSpace&, const Vec<T>&);                                 \
  template double sum<T>(const ExecSpace&, const Vec<T>&);                                         \
  template void scale<T>(const ExecSpace&, const Vec<T>&, T);

CUBELM_INSTANTIATE_OPTIM(float)
CUBELM_INSTANTIATE_OPTIM(double)

} // namespace cubelm::kernels
