#pragma once
// Views filled from the host and read back, for the comm tests.

#include "cubelm/core/types.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <functional>
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

} // namespace cubelm::testing
