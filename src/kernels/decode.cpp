#include "cubelm/kernels/decode.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/kernels/vmath.hpp"
#include "ranges.hpp"

#include <cmath>

namespace cubelm::kernels {

template <class T>
void cached_attention(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                      int heads, std::int64_t first, const Mat<T>& scores, const Mat<T>& out) {
  using C = compute_t<T>;
  const std::int64_t n = q.extent(0), width = q.extent(1), d = width / heads;
  const C scale = C(1) / static_cast<C>(std::sqrt(static_cast<double>(d)));
  Kokkos::parallel_for(
      "cubelm::cached_attention", per_row(exec, n * heads, first + n),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank(), i = r / heads, c0 = (r % heads) * d;
        const std::int64_t seen = first + i + 1; // keys 0 .. first + i
        team_for(team, 0, seen, [&](const std::int64_t s) {
          C dot = 0;
          for (std::int64_t j = 0; j < d; ++j)
            dot += C(q(i, c0 + j)) * C(k(s, c0 + j));
          scores(r, s) = dot * scale;
        });
        team_sync(team);
        const C m =
            team_max<C>(team, 0, seen, [&](const std::int64_t s) { return C(scores(r, s)); });
        team_sync(team);
        const C sum = team_sum<C>(team, 0, seen, [&](const std::int64_t s) {
          const C e = exp_of<C>(C(scores(r, s)) - m);
          scores(r, s) = e;
          return e;
        });
        team_sync(team);
        const C norm = C(1) / sum;
        // A plain if (kOnHost is a constant either way): nvcc's extended lambdas cannot
        // capture a variable first inside an if constexpr.
        if (kOnHost) {
          // One thread: the value rows in order, each a contiguous run of d columns; the same
          // sums, in the same order, as a GPU's thread per column.
          for (std::int64_t j = 0; j < d; ++j)
            out(i, c0 + j) = C(0);
          for (std::int64_t s = 0; s < seen; ++s) {
            const C e = scores(r, s);
            for (std::int64_t j = 0; j < d; ++j)
              out(i, c0 + j) = C(out(i, c0 + j)) + e * C(v(s, c0 + j));
          }
          for (std::int64_t j = 0; j < d; ++j)
            out(i, c0 + j) = C(out(i, c0 + j)) * norm;
        } else {
          // A thread per column: the team reads each value row together.
          team_for(team, 0, d, [&](const std::int64_t j) {
            C acc = 0;
            for (std::int64_t s = 0; s < seen; ++s)
              acc += C(scores(r, s)) * C(v(s, c0 + j));
            out(i, c0 + j) = acc * norm;
          });
        }
      });
}

template <class T>
void matvec(const ExecSpace& exec, const Mat<T>& a, const Vec<T>& x, T beta, const Vec<T>& y) {
  using C = compute_t<T>;
  const std::int64_t cols = a.extent(1);
  Kokkos::parallel_for(
      "cubelm::matvec", per_row(exec, a.extent(0), cols), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t i = team.league_rank();
        const C sum =
            team_sum<C>(team, 0, cols, [&](const std::int64_t j) { return C(a(i, j)) * C(x(j)); });
        team_once(team, [&]() { y(i) = beta == T(0) ? sum : sum + C(beta) * C(y(i)); });
      });
}

#define CUBELM_INSTANTIATE_DECODE(T)                                                               \
  template void cached_attention<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&, const Mat<T>&, \
                                    int, std::int64_t, const Mat<T>&, const Mat<T>&);              \
  template void matvec<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&, T, const Vec<T>&);
CUBELM_INSTANTIATE_DECODE(float)
CUBELM_INSTANTIATE_DECODE(double)
#undef CUBELM_INSTANTIATE_DECODE

} // namespace cubelm::kernels
