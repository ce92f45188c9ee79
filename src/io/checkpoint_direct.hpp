// The one writer's file driver: HDF5's file layout, with the checkpoint's chunks written to
// storage directly (O_DIRECT) by a thread of their own instead of through the page cache.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace cubelm::io::direct {

/// Raw data of at least kThreshold bytes (a chunk) starts at a multiple of kAlignment in the
/// file (H5Pset_alignment), so that its whole blocks can be written with O_DIRECT; the
/// last partial block and everything smaller (metadata, small tensors) go through the page
/// cache.
constexpr std::uint64_t kAlignment = 4096;
constexpr std::uint64_t kThreshold = 64 * 1024;

/// Buffers a file holds for the writes in flight: the thread writes one while the next are
/// filled.
constexpr int kBuffers = 3;

/// The first write to a file that failed, as the driver met it: "cannot write <n> bytes at
/// offset <o> of <file>: <the system's error>", or "" (the file holds all HDF5 wrote).
/// After a failure the driver drops the file's later writes and reports success to HDF5,
/// whose file close would otherwise fail half-way (and crash at exit): the caller, which
/// reads first() after its writes, its flush and its close, declares the file lost. The
/// caller records its own failures to write the file here too.
class Failure {
public:
  void record(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_.empty())
      first_ = what;
  }
  std::string first() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !first_.empty();
  }

private:
  mutable std::mutex mutex_;
  std::string first_;
};

/// Makes `fapl` open files with the direct driver, aligned as above, its failures going to
/// `failure` (which outlives the files). Where the file system refuses O_DIRECT (tmpfs,
/// some network file systems), the driver writes everything through the page cache, as
/// HDF5's POSIX driver does.
void use_driver(hid_t fapl, Failure* failure);

/// Host memory the driver holds while a file is open whose largest chunk is
/// `largest_chunk` bytes.
std::uint64_t buffer_bytes(std::uint64_t largest_chunk);

} // namespace cubelm::io::direct
