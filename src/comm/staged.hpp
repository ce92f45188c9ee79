#pragma once
// A buffer of a collective seen through a host copy from its group's staging pool when
// its route is Route::staged (device memory for MPI without GPU support, or host memory
// under CommOptions::stage_host_memory), else as it is.

#include "cubelm/comm/group.hpp"
#include "cubelm/comm/staging.hpp"

#include <memory>

namespace cubelm::comm::detail {

class Staged {
public:
  /// `buffer` through a host copy from `pool` when `stage` (copied in when `copy_in`).
  Staged(const Buffer& buffer, const StagingPool& pool, bool stage, bool copy_in);
  /// Copies the buffer into a staged host copy (made without copying in).
  void copy_in() const;
  /// What the backend reads and writes: the host copy, else the buffer.
  void* data() const { return host_ != nullptr ? host_.get() : buffer_.data; }
  /// Copies a staged result back to the buffer (nothing for const or unstaged ones).
  void copy_back() const;

private:
  Buffer buffer_;              // its keep holds the View while this lives
  std::shared_ptr<void> host_; // the pool's buffer, lent while this lives
};

} // namespace cubelm::comm::detail
