#include "cubelm/kernels/layernorm.hpp"

#include "columns.hpp"
#include "cubelm/core/compat.hpp"
#include "ranges.hpp"

namespace cubelm::kernels {

template <class T>
void row_sum(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& s) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_sum", per_row(exec, x.extent(0), h), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const T acc = team_sum<T>(team, 0, h, [&](const std::int64_t j) { return x(n, j); });
        team_once(team, [&]() { s(n) = acc; });
      });
}

template <class T>
void row_centered_squares(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& s,
                          std::int64_t features, const Vec<T>& v) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_centered_squares", per_row(exec, x.extent(0), h),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const T mu = s(n) / T(features);
        const T acc = team_sum<T>(team, 0, h, [&](const std::int64_t j) {
          const T d = x(n, j) - mu;
          return d * d;
        });
        team_once(team, [&]() { v(n) = acc; });
      });
}

template <class T>
void layernorm_normalize(const ExecSpace& exec, const Mat<T>& x, std::int64_t features,
                         const Vec<T>& gamma, const Vec<T>& beta, const Mat<T>& y,
                         const Vec<T>& mean, const Vec<T>& rstd) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::layernorm_normalize", per_row(exec, x.extent(0), h),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const T mu = mean(n) / T(features);
        const T rs = T(1) / kmath::sqrt(rstd(n) / T(features) + T(kLayerNormEps));
        team_for(team, 0, h,
                 [&](const std::int64_t j) { y(n, j) = (x(n, j) - mu) * rs * gamma(j) + beta(j); });
        team_sync(team); // every thread has read the sums before they are replaced
        team_once(team, [&]() {
          mean(n) = mu;
          rstd(n) = rs;
        });
      });
}

template <class T>
void layernorm_backward_sums(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                             const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                             const Mat<T>& sums) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::layernorm_backward_sums", per_row(exec, x.extent(0), h),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const T mu = mean(n), rs = rstd(n);
        const T sum_d =
            team_sum<T>(team, 0, h, [&](const std::int64_t j) { return dy(n, j) * gamma(j); });
        const T sum_dx = team_sum<T>(team, 0, h, [&](const std::int64_t j) {
          return dy(n, j) * gamma(j) * ((x(n, j) - mu) * rs);
        });
        team_once(team, [&]() {
          sums(n, 0) = sum_d;
          sums(n, 1) = sum_dx;
        });
      });
}

template <class T>
void layernorm_backward_input(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                              const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                              const Mat<T>& sums, std::int64_t features, const Mat<T>& dx) {
  for_each_element(
      "cubelm::layernorm_backward_input", exec, x.extent(0), x.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        // dxhat = dy * gamma; dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
        const T xhat = (x(n, j) - mean(n)) * rstd(n);
        dx(n, j) += rstd(n) * (dy(n, j) * gamma(j) - sums(n, 0) / T(features) -
                               xhat * (sums(n, 1) / T(features)));
      });
}

template <class T>
void layernorm_backward_params(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                               const Vec<T>& mean, const Vec<T>& rstd, const Vec<T>& dgamma,
                               const Vec<T>& dbeta) {
  static detail::Scratch<T> partial("cubelm::ln_param_partial");
  detail::column_sums<2, T>(
      exec, "cubelm::layernorm_backward_params", x.extent(0), x.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        const T d = dy(n, j);
        return Kokkos::Array<T, 2>{d * (x(n, j) - mean(n)) * rstd(n), d};
      },
      dgamma, dbeta, partial);
}

template <class T>
void layernorm_forward(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& gamma,
                       const Vec<T>& beta, const Mat<T>& y, const Vec<T>& mean,
                       const Vec<T>& rstd) {
  row_sum<T>(exec, x, mean);
  row_centered_squares<T>(exec, x, mean, x.extent(1), rstd);
  layernorm_normalize<T>(exec, x, x.extent(1), gamma, beta, y, mean, rstd);
}

template <class T>
void layernorm_backward(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                        const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                        const Mat<T>& dx, const Vec<T>& dgamma, const Vec<T>& dbeta) {
  const Mat<T> sums("cubelm::ln_sums", x.extent(0), 2);
  layernorm_backward_sums<T>(exec, dy, x, gamma, mean, rstd, sums);
  layernorm_backward_input<T>(exec, dy, x, gamma, mean, rstd, sums, x.extent(1), dx);
  layernorm_backward_params<T>(exec, dy, x, mean, rstd, dgamma, dbeta);
}

#define CUBELM_INSTANTIATE_LAYERNORM(T)                                                            \
  template void row_sum<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&);                        \
  template void row_centered_squares<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&,            \
                                        std::int64_t, const Vec<T>&);                              \
  template void layernorm_normalize<T>(const ExecSpace&, const Mat<T>&, std::int64_t,              \
                                       const Vec<T>&, const Vec<T>&, const Mat<T>&, const Vec<T>&, \
                                       const Vec<T>&);                                             \
  template void layernorm_backward_sums<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,         \
                                           const Vec<T>&, const Vec<T>&, const Vec<T>&,            \
                                           const Mat<T>&);                                         \
  template void layernorm_backward_input<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,        \
                                            const Vec<T>&, const Vec<T>&, const Vec<T>&,           \
                                            const Mat<T>&, std::int64_t, const Mat<T>&);           \
  template void layernorm_backward_params<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,       \
                                             const Vec<T>&, const Vec<T>&, const Vec<T>&,          \
                                             const Vec<T>&);                                       \
  template void layernorm_forward<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&,               \
                                     const Vec<T>&, const Mat<T>&, const Vec<T>&, const Vec<T>&);  \
  template void layernorm_backward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,              \
                                      const Vec<T>&, const Vec<T>&, const Vec<T>&, const Mat<T>&,  \
                                      const Vec<T>&, const Vec<T>&);

CUBELM_INSTANTIATE_LAYERNORM(float)
CUBELM_INSTANTIATE_LAYERNORM(double)

} // namespace cubelm::kernels
