#pragma once
// Device Views filled from the host and read back, for the comm tests.

#include "cubelm/core/types.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <functional>
#include <vector>

namespace cubelm::testing {

/// A View of `n` elements, element i = f(i), written on the host and copied over.
template <class T>
View1<T> filled(std::size_t n, const std::function<T(std::size_t)>& f) {
  View1<T> v("v", n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < n; ++i)
    h(i) = f(i);
  Kokkos::deep_copy(v, h);
  return v;
}

/// The elements of `v`, copied to the host.
template <class T>
std::vector<T> to_host(const View1<T>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<T>(h.data(), h.data() + h.extent(0));
}

} // namespace cubelm::testing
