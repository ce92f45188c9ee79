#include "cubelm/comm/staging.hpp"

#include "cubelm/core/error.hpp"

#include <mutex>
#include <vector>

namespace cubelm::comm::detail {

struct StagingPool::State {
  struct Buffer {
    // The label that allocation counters see (tests/test_allocations.cpp).
    Kokkos::View<unsigned char*, Kokkos::HostSpace> bytes;
    bool lent = false;
  };
  std::mutex mutex;
  std::vector<Buffer> buffers;
};

StagingPool::StagingPool() : state_(std::make_shared<State>()) {}

std::shared_ptr<void> StagingPool::acquire(std::size_t bytes) const {
  CUBELM_ASSERT(bytes > 0, "a staging buffer of 0 bytes");
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::size_t at = 0;
  while (at < s.buffers.size() && (s.buffers[at].lent || s.buffers[at].bytes.extent(0) != bytes))
    ++at;
  if (at == s.buffers.size()) {
    State::Buffer b;
    b.bytes = Kokkos::View<unsigned char*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::comm::stage"), bytes);
    s.buffers.push_back(std::move(b));
  }
  s.buffers[at].lent = true;
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<void>(s.buffers[at].bytes.data(), [state, at](void*) {
    const std::lock_guard<std::mutex> lock(state->mutex);
    state->buffers[at].lent = false;
  });
}

std::size_t StagingPool::buffers() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->buffers.size();
}

} // namespace cubelm::comm::detail
