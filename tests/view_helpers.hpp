#pragma once
// Views filled from the host and read back, and the numeric helpers the tests share:
// random fills, host copies as doubles, gradients against central differences.

#include "cubelm/core/types.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <random>
#include <vector>

namespace cubelm::testing {

/// A View of `n` elements in memory space `M`, element i = f(i), written on the
/// host and copied over.
template <class T, class M>
Kokkos::View<T*, Kokkos::LayoutRight, M> filled_in(std::size_t n,
                                                   const std::function<T(std::size_t)>& f) {
  Kokkos::View<T*, Kokkos::LayoutRight, M> v("v", n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < n; ++i)
    h(i) = f(i);
  Kokkos::deep_copy(v, h);
  return v;
}

/// The same in the default memory space (a View1).
template <class T>
View1<T> filled(std::size_t n, const std::function<T(std::size_t)>& f) {
  return filled_in<T, MemSpace>(n, f);
}

/// The elements of any rank-1 View, copied to the host.
template <class V>
std::vector<typename V::non_const_value_type> values(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<typename V::non_const_value_type>(h.data(), h.data() + h.extent(0));
}

/// The elements of a View1, copied to the host.
template <class T>
std::vector<T> to_host(const View1<T>& v) {
  return values(v);
}

/// True where the default memory space is the host's (a CPU build); false on a GPU.
inline constexpr bool kHostMemory =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;

/// Fills every element of `view` (its whole span) with uniform numbers in [lo, hi) from
/// a generator seeded with `seed`.
template <class V>
void randomize(const V& view, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  auto h = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < view.span(); ++i)
    h.data()[i] = static_cast<typename V::non_const_value_type>(dist(gen));
  Kokkos::deep_copy(view, h);
}

/// Every element of any View (its whole span), copied to the host as doubles.
template <class V>
std::vector<double> host(const V& view) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<double>(h.data(), h.data() + view.span());
}

/// The largest |a[i] - b[i]| / max(1, |b[i]|) (b the reference); the sizes must agree.
inline double max_error(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(b[i])));
  return worst;
}

/// The worst gradient error of fd_error, and where it is.
struct FdError {
  double worst = 0;   ///< largest |analytic - numeric| / max(floor, |numeric|)
  std::size_t at = 0; ///< the element where it is
};

/// `analytic` against the central differences (step h) of `loss` in the elements of
/// `param` (both Views of the same span). On a GPU, where each loss is many kernel
/// launches, `sampled` probes about 8 elements spread over the span (first and last
/// among them) instead of every one; a CPU build always probes every element.
template <class V, class G>
FdError fd_error(const V& param, const G& analytic, const std::function<double()>& loss,
                 double floor = 1.0, bool sampled = false, double h = 1e-6) {
  auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), param);
  const std::vector<double> grad = host(analytic);
  const std::size_t n = param.span();
  const std::size_t stride = sampled && !kHostMemory ? std::max<std::size_t>(1, (n - 1) / 7) : 1;
  std::vector<std::size_t> probes;
  for (std::size_t i = 0; i < n; i += stride)
    probes.push_back(i);
  if (n > 0 && probes.back() != n - 1)
    probes.push_back(n - 1);
  FdError out;
  for (const std::size_t i : probes) {
    const double orig = hp.data()[i];
    hp.data()[i] = orig + h;
    Kokkos::deep_copy(param, hp);
    const double up = loss();
    hp.data()[i] = orig - h;
    Kokkos::deep_copy(param, hp);
    const double down = loss();
    hp.data()[i] = orig;
    Kokkos::deep_copy(param, hp);
    const double numeric = (up - down) / (2 * h);
    const double err = std::fabs(grad[i] - numeric) / std::max(floor, std::fabs(numeric));
    if (err > out.worst)
      out = {err, i};
  }
  return out;
}

} // namespace cubelm::testing
