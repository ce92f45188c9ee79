#include "cubelm/kernels/elementwise.hpp"

#include "columns.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/kernels/vmath.hpp"
#include "ranges.hpp"

namespace cubelm::kernels {

template <class T>
void bias_add(const ExecSpace& exec, const Mat<T>& y, const Vec<T>& b) {
  using C = compute_t<T>;
  for_each_element(
      "cubelm::bias_add", exec, y.extent(0), y.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        y(n, j) = C(y(n, j)) + C(b(j));
      });
}

template <class T>
void bias_backward(const ExecSpace& exec, const Mat<T>& dy, const Vec<compute_t<T>>& db) {
  using C = compute_t<T>;
  static detail::Scratch<C> partial("cubelm::bias_partial");
  detail::column_sums<1, C>(
      exec, "cubelm::bias_backward", dy.extent(0), dy.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        return Kokkos::Array<C, 1>{C(dy(n, j))};
      },
      db, Vec<C>(), partial);
}

namespace {
// sqrt(2/pi) and the cubic coefficient of the tanh approximation of GELU.
constexpr double kGeluScale = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
} // namespace

// GELU's tanh(sqrt(2/pi) (v + 0.044715 v^3)).
template <class C>
KOKKOS_INLINE_FUNCTION C gelu_tanh(C v) {
  return tanh_of<C>(C(kGeluScale) * (v + C(kGeluCubic) * v * v * v));
}

template <class T>
void gelu_forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, const Mat<T>& th) {
  using C = compute_t<T>;
  if constexpr (kOnHost && !std::is_same_v<T, C>) {
    // bf16 on CPUs: the tanh on float copies of a chunk of the row (for_each_chunk).
    for_each_chunk("cubelm::gelu_forward", exec, x.extent(0), x.extent(1),
                   [=](const std::int64_t n, const std::int64_t j0, const std::int64_t width) {
                     C v[kChunk], t[kChunk];
                     for (std::int64_t j = 0; j < width; ++j)
                       v[j] = x(n, j0 + j);
                     for (std::int64_t j = 0; j < width; ++j)
                       t[j] = gelu_tanh(v[j]);
                     for (std::int64_t j = 0; j < width; ++j) {
                       th(n, j0 + j) = t[j];
                       y(n, j0 + j) = C(0.5) * v[j] * (C(1) + t[j]);
                     }
                   });
    return;
  }
  for_each_element(
      "cubelm::gelu_forward", exec, x.extent(0), x.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        const C v = x(n, j);
        const C t = gelu_tanh(v);
        th(n, j) = t;
        y(n, j) = C(0.5) * v * (C(1) + t);
      });
}

template <class T>
void gelu_backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& th, const Mat<T>& dy,
                   const Mat<T>& dx) {
  using C = compute_t<T>;
  for_each_element(
      "cubelm::gelu_backward", exec, x.extent(0), x.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        const C v = x(n, j);
        const C t = th(n, j);
        const C du = C(kGeluScale) * (C(1) + C(3 * kGeluCubic) * v * v);
        const C grad = C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * du;
        dx(n, j) = C(dy(n, j)) * grad;
      });
}

template <class T>
void add_inplace(const ExecSpace& exec, const Mat<T>& y, const Mat<T>& x) {
  using C = compute_t<T>;
  for_each_element(
      "cubelm::add_inplace", exec, y.extent(0), y.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        y(n, j) = C(y(n, j)) + C(x(n, j));
      });
}

#define CUBELM_INSTANTIATE_ELEMENTWISE(T)                                                          \
  template void bias_add<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&);                       \
  template void bias_backward<T>(const ExecSpace&, const Mat<T>&, const Vec<compute_t<T>>&);       \
  template void gelu_forward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&, const Mat<T>&);    \
  template void gelu_backward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&, const Mat<T>&,    \
                                 const Mat<T>&);                                                   \
  template void add_inplace<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&);

CUBELM_INSTANTIATE_ELEMENTWISE(float)
CUBELM_INSTANTIATE_ELEMENTWISE(double)
CUBELM_INSTANTIATE_ELEMENTWISE(bf16)

} // namespace cubelm::kernels
