#include "cubelm/kernels/layernorm.hpp"

#include "columns.hpp"
#include "cubelm/core/compat.hpp"
#include "ranges.hpp"

namespace cubelm::kernels {

template <class T>
void row_sum(const ExecSpace& exec, const Mat<T>& x, const Vec<compute_t<T>>& s) {
  using C = compute_t<T>;
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_sum", per_row(exec, x.extent(0), h), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const C acc = team_sum<C>(team, 0, h, [&](const std::int64_t j) { return C(x(n, j)); });
        team_once(team, [&]() { s(n) = acc; });
      });
}

template <class T>
void row_centered_squares(const ExecSpace& exec, const Mat<T>& x, const Vec<compute_t<T>>& s,
                          std::int64_t features, const Vec<compute_t<T>>& v) {
  using C = compute_t<T>;
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_centered_squares", per_row(exec, x.extent(0), h),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const C mu = s(n) / C(features);
        const C acc = team_sum<C>(team, 0, h, [&](const std::int64_t j) {
          const C d = C(x(n, j)) - mu;
          return d * d;
        });
        team_once(team, [&]() { v(n) = acc; });
      });
}

template <class T>
void layernorm_normalize(const ExecSpace& exec, const Mat<T>& x, std::int64_t features,
                         const Vec<T>& gamma, const Vec<T>& beta, const Mat<T>& y,
                         const Vec<compute_t<T>>& mean, const Vec<compute_t<T>>& rstd) {
  using C = compute_t<T>;
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::layernorm_normalize", per_row(exec, x.extent(0), h),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const C mu = mean(n) / C(features);
        const C rs = C(1) / kmath::sqrt(rstd(n) / C(features) + C(kLayerNormEps));
        team_for(team, 0, h, [&](const std::int64_t j) {
          y(n, j) = (C(x(n, j)) - mu) * rs * C(gamma(j)) + C(beta(j));
        });
        team_sync(team); // every thread has read the sums before they are replaced
        team_once(team, [&]() {
          mean(n) = mu;
          rstd(n) = rs;
        });
      });
}

template <class T>
void layernorm_backward_sums(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                             const Vec<T>& gamma, const Vec<compute_t<T>>& mean,
                             const Vec<compute_t<T>>& rstd, const Mat<compute_t<T>>& sums) {
  using C = compute_t<T>;
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::layernorm_backward_sums", per_row(exec, x.extent(0), h),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const C mu = mean(n), rs = rstd(n);
        const C sum_d = team_sum<C>(
            team, 0, h, [&](const std::int64_t j) { return C(dy(n, j)) * C(gamma(j)); });
        const C sum_dx = team_sum<C>(team, 0, h, [&](const std::int64_t j) {
          return C(dy(n, j)) * C(gamma(j)) * ((C(x(n, j)) - mu) * rs);
        });
        team_once(team, [&]() {
          sums(n, 0) = sum_d;
          sums(n, 1) = sum_dx;
        });
      });
}

template <class T>
void layernorm_backward_input(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                              const Vec<T>& gamma, const Vec<compute_t<T>>& mean,
                              const Vec<compute_t<T>>& rstd, const Mat<compute_t<T>>& sums,
                              std::int64_t features, const Mat<T>& dx) {
  using C = compute_t<T>;
  for_each_element(
      "cubelm::layernorm_backward_input", exec, x.extent(0), x.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        // dxhat = dy * gamma; dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
        const C xhat = (C(x(n, j)) - mean(n)) * rstd(n);
        dx(n, j) = C(dx(n, j)) + rstd(n) * (C(dy(n, j)) * C(gamma(j)) - sums(n, 0) / C(features) -
                                            xhat * (sums(n, 1) / C(features)));
      });
}

template <class T>
void layernorm_backward_params(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                               const Vec<compute_t<T>>& mean, const Vec<compute_t<T>>& rstd,
                               const Vec<compute_t<T>>& dgamma, const Vec<compute_t<T>>& dbeta) {
  using C = compute_t<T>;
  static detail::Scratch<C> partial("cubelm::ln_param_partial");
  detail::column_sums<2, C>(
      exec, "cubelm::layernorm_backward_params", x.extent(0), x.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        const C d = dy(n, j);
        return Kokkos::Array<C, 2>{d * (C(x(n, j)) - mean(n)) * rstd(n), d};
      },
      dgamma, dbeta, partial);
}

template <class T>
void layernorm_forward(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& gamma,
                       const Vec<T>& beta, const Mat<T>& y, const Vec<compute_t<T>>& mean,
                       const Vec<compute_t<T>>& rstd) {
  row_sum<T>(exec, x, mean);
  row_centered_squares<T>(exec, x, mean, x.extent(1), rstd);
  layernorm_normalize<T>(exec, x, x.extent(1), gamma, beta, y, mean, rstd);
}

template <class T>
void layernorm_backward(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                        const Vec<T>& gamma, const Vec<compute_t<T>>& mean,
                        const Vec<compute_t<T>>& rstd, const Mat<T>& dx,
                        const Vec<compute_t<T>>& dgamma, const Vec<compute_t<T>>& dbeta) {
  const Mat<compute_t<T>> sums("cubelm::ln_sums", x.extent(0), 2);
  layernorm_backward_sums<T>(exec, dy, x, gamma, mean, rstd, sums);
  layernorm_backward_input<T>(exec, dy, x, gamma, mean, rstd, sums, x.extent(1), dx);
  layernorm_backward_params<T>(exec, dy, x, mean, rstd, dgamma, dbeta);
}

#define CUBELM_INSTANTIATE_LAYERNORM(T)                                                            \
  template void row_sum<T>(const ExecSpace&, const Mat<T>&, const Vec<compute_t<T>>&);             \
  template void row_centered_squares<T>(const ExecSpace&, const Mat<T>&, const Vec<compute_t<T>>&, \
                                        std::int64_t, const Vec<compute_t<T>>&);                   \
  template void layernorm_normalize<T>(const ExecSpace&, const Mat<T>&, std::int64_t,              \
                                       const Vec<T>&, const Vec<T>&, const Mat<T>&,                \
                                       const Vec<compute_t<T>>&, const Vec<compute_t<T>>&);        \
  template void layernorm_backward_sums<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,         \
                                           const Vec<T>&, const Vec<compute_t<T>>&,                \
                                           const Vec<compute_t<T>>&, const Mat<compute_t<T>>&);    \
  template void layernorm_backward_input<T>(                                                       \
      const ExecSpace&, const Mat<T>&, const Mat<T>&, const Vec<T>&, const Vec<compute_t<T>>&,     \
      const Vec<compute_t<T>>&, const Mat<compute_t<T>>&, std::int64_t, const Mat<T>&);            \
  template void layernorm_backward_params<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,       \
                                             const Vec<compute_t<T>>&, const Vec<compute_t<T>>&,   \
                                             const Vec<compute_t<T>>&, const Vec<compute_t<T>>&);  \
  template void layernorm_forward<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&,               \
                                     const Vec<T>&, const Mat<T>&, const Vec<compute_t<T>>&,       \
                                     const Vec<compute_t<T>>&);                                    \
  template void layernorm_backward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,              \
                                      const Vec<T>&, const Vec<compute_t<T>>&,                     \
                                      const Vec<compute_t<T>>&, const Mat<T>&,                     \
                                      const Vec<compute_t<T>>&, const Vec<compute_t<T>>&);

CUBELM_INSTANTIATE_LAYERNORM(float)
CUBELM_INSTANTIATE_LAYERNORM(double)
CUBELM_INSTANTIATE_LAYERNORM(bf16)

} // namespace cubelm::kernels
