#include "cubelm/comm/staging.hpp"

#include "cubelm/core/error.hpp"

#include "staged.hpp"

#include <Kokkos_Core.hpp>

#include <mutex>
#include <vector>

namespace cubelm::comm::detail {

struct StagingPool::State {
  struct Buffer {
    // The label that allocation counters see (tests/train/test_allocations.cpp).
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

namespace {

// `bytes` from `from` to `to`, one of them a host copy and the other in host memory
// (`host`) or the default device memory space; fences as Kokkos::deep_copy does.
void copy_bytes(void* to, bool to_host, const void* from, bool from_host, std::size_t bytes) {
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  using Device = Kokkos::DefaultExecutionSpace::memory_space;
  char* t = static_cast<char*>(to);
  const char* f = static_cast<const char*>(from);
  if (to_host && from_host)
    Kokkos::deep_copy(Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>(t, bytes),
                      Kokkos::View<const char*, Kokkos::HostSpace, Unmanaged>(f, bytes));
  else if (to_host)
    Kokkos::deep_copy(Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>(t, bytes),
                      Kokkos::View<const char*, Device, Unmanaged>(f, bytes));
  else
    Kokkos::deep_copy(Kokkos::View<char*, Device, Unmanaged>(t, bytes),
                      Kokkos::View<const char*, Kokkos::HostSpace, Unmanaged>(f, bytes));
}

} // namespace

Staged::Staged(const Buffer& buffer, const StagingPool& pool, bool stage, bool copy_in)
    : buffer_(buffer) {
  if (stage && buffer_.count > 0) {
    host_ = pool.acquire(buffer_.count * buffer_.element_bytes);
    if (copy_in)
      this->copy_in();
  }
}

void Staged::copy_in() const {
  if (host_ != nullptr)
    copy_bytes(host_.get(), true, buffer_.data, buffer_.host,
               buffer_.count * buffer_.element_bytes);
}

void Staged::copy_back() const {
  if (host_ != nullptr && buffer_.writable)
    copy_bytes(buffer_.data, buffer_.host, host_.get(), true,
               buffer_.count * buffer_.element_bytes);
}

} // namespace cubelm::comm::detail
