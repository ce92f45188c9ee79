#pragma once
// A device buffer that one kernel keeps between its calls: grown to the largest
// request, never shrunk, so that steady-state steps allocate nothing; released
// before Kokkos finalizes. Calls on one execution space instance are ordered,
// so a call may reuse the buffer while the previous call's kernels are queued
// before its own. Internal to src/kernels.

#include "cubelm/kernels/views.hpp"

#include <cstddef>
#include <string>

namespace cubelm::kernels::detail {

template <class E>
class Scratch {
public:
  explicit Scratch(const char* label) : label_(label) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  /// \brief A buffer of at least `n` elements (contents undefined).
  Kokkos::View<E*, Kokkos::LayoutRight, MemSpace> get(std::size_t n) {
    if (!hooked_) {
      Kokkos::push_finalize_hook([this] {
        buffer_ = {};
        hooked_ = false;
      });
      hooked_ = true;
    }
    if (buffer_.extent(0) < n)
      buffer_ = Kokkos::View<E*, Kokkos::LayoutRight, MemSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label_)), n);
    return buffer_;
  }

private:
  const char* label_;
  Kokkos::View<E*, Kokkos::LayoutRight, MemSpace> buffer_;
  bool hooked_ = false;
};

} // namespace cubelm::kernels::detail
