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
#include <vector>

namespace cubelm::io::direct {

/// Raw data of at least kThreshold bytes (a chunk) starts at a multiple of kAlignment in the
/// file (H5Pset_alignment), so that its whole blocks can be written with O_DIRECT; the
/// last partial block and everything smaller (metadata, small tensors) go through the page
/// cache.
constexpr std::uint64_t kAlignment = 4096;
constexpr std::uint64_t kThreshold = 64 * 1024;

/// `bytes` rounded up to whole blocks of kAlignment.
inline std::uint64_t whole_blocks(std::uint64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

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

/// The one writer's slabs (checkpoint_writer_one.cpp): block-aligned memory it lends the
/// driver, taken in turn from a ring of kCount times the largest slab asked for, so that
/// the driver has up to that much queued while the writer assembles the next slabs, however
/// small the tensors (with a slab of its own per tensor, three slabs held three tensors:
/// behind GPT-2's biases and 768 x 768 matrices the driver had a few milliseconds of
/// work, and waited for the writer 0.1 s of a 1 s save).
/// A chunk written from a slab is queued without a copy, and the driver's thread writes
/// its whole blocks from the slab (copying them into a buffer of its own first only where
/// the chunk does not start on a block boundary in memory), except the last whole block,
/// which the write puts through the page cache with the partial one before it returns. So
/// the writer may change a chunk's last 4 KiB once its write has returned (as write_chunks
/// does, putting back the element the checksum borrowed), and nothing else of a slab
/// until the driver has written it: next() and settle() wait for that.
class Slabs {
public:
  static constexpr int kCount = 12;

  Slabs() = default;
  ~Slabs() { settle(); }
  Slabs(const Slabs&) = delete;
  Slabs& operator=(const Slabs&) = delete;

  /// A slab of at least `elements` floats on a block boundary: the ring's next space,
  /// waiting until the driver has written what it held. The slab given before is then
  /// the writer's no longer. The ring grows to kCount slabs of `largest` floats (the
  /// largest slab of the tensor) where it is smaller, once the driver has written all of it.
  float* next(std::size_t elements, std::size_t largest);
  /// Waits until no write from a slab is queued or in flight.
  void settle();

  // For the driver: the slab that holds [data, data + bytes), or -1; a write from slab i
  // queued and done.
  int holding(const void* data, std::size_t bytes) const;
  void queued(int i);
  void written(int i);

private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  struct Slab {
    int id;
    std::uint64_t at, bytes; // in the ring
    int in_flight;
  };
  Slab* find(int id); // mutex held; null once the slab is free
  mutable std::mutex mutex_;
  std::condition_variable written_;
  std::unique_ptr<char, Free> ring_;
  std::uint64_t capacity_ = 0, head_ = 0; // head_: where the next slab is tried first
  std::vector<Slab> live_; // the writer's slab and those with writes queued, oldest first
  int given_ = -1, next_id_ = 0;
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
