#pragma once
/// \file
/// \brief Host copies of device memory for MPI without GPU support (Group's staged
/// route): the buffers of one group, kept and reused (src/comm/staged.hpp stages a
/// View's elements through one of them).

#include <cstddef>
#include <memory>

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

} // namespace cubelm::comm::detail
