// The one writer's file driver: HDF5's file layout, with the checkpoint's chunks written to
// storage directly (O_DIRECT) by a thread of their own instead of through the page cache.
#pragma once

#include <hdf5.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace cubelm::io::direct {

/// Raw data of at least kThreshold bytes (a chunk) starts at a multiple of kAlignment in the
/// file (H5Pset_alignment), so that its whole blocks can be written with O_DIRECT; the
/// last partial block and everything smaller (metadata, small tensors) go through the page
/// cache.
constexpr std::uint64_t kAlignment = 4096;
constexpr std::uint64_t kThreshold = 64 * 1024;

/// Buffers a file holds for the copies of chunks in flight that are not lent (Slabs): the
/// thread writes one while the next are filled. The thread has one more of its own, for
/// lent chunks that do not start on a block boundary in memory.
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

/// The one writer's two slabs (checkpoint_writer_one.cpp): block-aligned memory it lends
/// the driver. A chunk written from a slab is queued without a copy, and the driver's
/// thread writes its whole blocks from the slab (copying them into a buffer of its own
/// only where the chunk does not start on a block boundary in memory), except the last
/// whole block, which the write puts through the page cache with the partial one before it
/// returns. So the writer may change a chunk's last 4 KiB once its write has returned (as
/// write_chunks does, putting back the element the checksum borrowed), and nothing else
/// of a slab until the driver has written it: next() and settle() wait for that.
class Slabs {
public:
  static constexpr int kCount = 3;

  Slabs() = default;
  ~Slabs() { settle(); }
  Slabs(const Slabs&) = delete;
  Slabs& operator=(const Slabs&) = delete;

  /// The next free slab in turn (they take turns across tensors, so that some are written
  /// while the next arrives), waiting for the oldest if none is free, of at least `elements`
  /// floats (after growing, what it held is gone).
  float* next(std::size_t elements);
  /// Waits until no write from slab i (from any slab, without i) is queued or in flight.
  void settle(int i);
  void settle();

  // For the driver: the slab that holds [data, data + bytes), or -1; a write from slab i
  // queued and done.
  int holding(const void* data, std::size_t bytes) const;
  void queued(int i);
  void written(int i);

private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  struct Slab {
    std::unique_ptr<float, Free> data;
    std::size_t elements = 0;
    int in_flight = 0;
  };
  mutable std::mutex mutex_;
  std::condition_variable written_;
  Slab slabs_[kCount];
  int turn_ = 0; // the slab next() gives
};

/// Makes `fapl` open files with the direct driver, aligned as above, its failures going to
/// `failure` and the chunks written from `slabs` (if any) lent rather than copied (both
/// outlive the files). Where the file system refuses O_DIRECT (tmpfs, some network file
/// systems), the driver writes everything through the page cache, as HDF5's POSIX driver
/// does.
void use_driver(hid_t fapl, Failure* failure, Slabs* slabs = nullptr);

/// Host memory the driver holds while a file is open whose largest chunk is
/// `largest_chunk` bytes.
std::uint64_t buffer_bytes(std::uint64_t largest_chunk);

} // namespace cubelm::io::direct
