#pragma once
/// \file
/// \brief Host copies of device memory for MPI without GPU support (Group's staged
/// route): the buffers of one group, kept and reused, and a View's flat view
/// through one of them. Internal to the comm layer's templates.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <type_traits>

namespace cubelm::comm::detail {

/// \brief The host buffers of one group's staged operations, reused from call to call.
///
/// A buffer is lent to one operation until the last copy of the pointer acquire()
/// returned is gone (its Request has completed), and it serves operations of its own
/// size only: acquire() lends a free buffer of the size asked for, else allocates
/// one. Sizes come from the spans of the Views staged, which a training step keeps
/// from step to step, so the pool holds, for each size, as many buffers as the group
/// ever had operations of that size in flight at once, and a step that repeats the
/// previous one allocates nothing. (Only a new high of operations in flight, which
/// for the pipeline's transfers depends on timing, adds a buffer.) No buffer is
/// ever grown, replaced or freed while the pool lives: an allocation is always one
/// more buffer. Copies of a pool share its buffers; buffers live until the pool and
/// every lent pointer are gone.
class StagingPool {
public:
  StagingPool();
  /// \brief A host buffer of at least `bytes` (> 0) bytes, aligned for any scalar,
  /// lent until the returned pointer and its copies are destroyed.
  std::shared_ptr<void> acquire(std::size_t bytes) const;
  /// \brief Buffers held, lent or free: the host allocations made so far.
  std::size_t buffers() const;

private:
  struct State;
  std::shared_ptr<State> state_;
};

/// A View seen as a flat buffer, with a host copy from `pool` when it must be staged.
template <class V>
class Staged {
  using value_type = typename V::value_type;
  using T = std::remove_const_t<value_type>;
  using Flat =
      Kokkos::View<value_type*, typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using HostFlat = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

public:
  Staged(const V& view, const StagingPool& pool, bool stage, bool copy_in)
      : flat_(view.data(), view.span()) {
    if (stage && view.span() > 0) {
      lease_ = pool.acquire(view.span() * sizeof(T));
      host_ = HostFlat(static_cast<T*>(lease_.get()), view.span());
      if (copy_in)
        Kokkos::deep_copy(host_, flat_);
    }
  }
  /// Copies the View into a staged host copy (made without copying in).
  void copy_in() const {
    if (host_.data() != nullptr)
      Kokkos::deep_copy(host_, flat_);
  }
  void* data() const {
    return host_.data() != nullptr ? static_cast<void*>(host_.data())
                                   : const_cast<void*>(static_cast<const void*>(flat_.data()));
  }
  /// Copies a staged result back to the original View.
  void copy_back() const {
    if constexpr (!std::is_const_v<value_type>)
      if (host_.data() != nullptr)
        Kokkos::deep_copy(flat_, host_);
  }

private:
  Flat flat_;
  std::shared_ptr<void> lease_; // the pool's buffer behind host_, lent while this lives
  HostFlat host_;
};

} // namespace cubelm::comm::detail
