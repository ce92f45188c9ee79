// The one writer's HDF5 file driver (checkpoint_direct.hpp). HDF5 lays the file out and
// writes its metadata through this driver as through its POSIX one; the whole blocks of
// each chunk it writes go to the file's own thread, which writes them with O_DIRECT while
// the writer assembles the next chunks: from the writer's slab where it lends them
// (Slabs), otherwise from a copy. Through the page cache, one process copies every byte
// into the cache and then waits for writeback, which alone streams far below what the
// device takes (docs/training.md, "Checkpoint speed").
//
// Ordering: every write goes through the thread, in the order HDF5 made them: the whole
// blocks of a chunk (which starts on a block boundary) with O_DIRECT, then the rest of it,
// and everything smaller (metadata, small tensors), through the page cache. From the
// writer a write through the page cache would wait for the file's inode lock, which a
// direct write in flight holds; from the thread, the writer never touches the file while
// it assembles chunks. A read waits for the writes in flight, and so do flush, truncate
// and close.
//
// Failures: the first failed write goes to the file's Failure, and from then on the file
// is lost: later writes are dropped and flush, truncate and close succeed, so that HDF5
// closes the file cleanly (a failed close leaves HDF5 holding a half-closed file). The
// writer reads the Failure and keeps the file from becoming the checkpoint.

#include "checkpoint_direct.hpp"

#include "checkpoint_chunks.hpp"

#include "cubelm/core/error.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cubelm::io::direct {

namespace {

// Reports a failure to HDF5's error stack, where CUBELM_HDF5_CHECK finds it.
void push_error(hid_t minor, const std::string& message) {
  H5Epush2(H5E_DEFAULT, __FILE__, "cubelm direct driver", __LINE__, H5E_ERR_CLS, H5E_VFL, minor,
           "%s", message.c_str());
}

// Writes all of `bytes` at `offset`, retrying short writes; errno on failure.
bool write_all(int fd, const char* data, std::size_t bytes, off_t offset) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, bytes, offset);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;
      return false;
    }
    data += n;
    bytes -= static_cast<std::size_t>(n);
    offset += n;
  }
  return true;
}

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};

// A block of memory aligned for O_DIRECT.
struct Buffer {
  std::unique_ptr<char, AlignedFree> data;
  std::size_t capacity = 0;
};

std::string write_failed(std::size_t bytes, std::uint64_t offset, const std::string& path) {
  return "cannot write " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
         " of " + path + ": " + std::strerror(errno);
}

// The thread that writes the queued blocks, and the buffers they are copied into.
class DirectQueue {
public:
  DirectQueue(int direct_fd, int cached_fd, std::string path, Failure* failure, Slabs* slabs)
      : direct_fd_(direct_fd), cached_fd_(cached_fd), path_(std::move(path)), failure_(failure),
        slabs_(slabs), thread_([this] { run(); }) {}

  ~DirectQueue() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  DirectQueue(const DirectQueue&) = delete;
  DirectQueue& operator=(const DirectQueue&) = delete;

  // Queues the write of `size` bytes at `offset`: the first `bytes` (a multiple of
  // kAlignment, or none) directly, copied into a free buffer (waiting for one), or, with
  // `slab` >= 0, from the slab, which holds them until the thread has written them (Slabs);
  // the rest, copied, through the page cache after them.
  void push(std::uint64_t offset, const void* data, std::size_t bytes, std::size_t size, int slab) {
    const char* from = static_cast<const char*>(data);
    Job job{offset, bytes, Buffer{}, nullptr, slab, std::vector<char>(from + bytes, from + size)};
    std::unique_lock<std::mutex> lock(mutex_);
    if (slab >= 0) {
      job.lent = from;
      slabs_->queued(slab);
    } else if (bytes > 0) {
      done_.wait(lock, [&] { return in_use_ < kBuffers; });
      job.buffer = take(bytes);
      ++in_use_;
      lock.unlock();
      std::memcpy(job.buffer.data.get(), data, bytes);
      lock.lock();
    }
    queue_.push_back(std::move(job));
    lock.unlock();
    wake_.notify_all();
  }

  // Waits for every queued write.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return queue_.empty() && !writing_; });
  }

private:
  struct Job {
    std::uint64_t offset;
    std::size_t bytes;
    Buffer buffer;              // a copy of the bytes (push), or
    const char* lent = nullptr; // the bytes in slab `slab`
    int slab = -1;
    std::vector<char> tail; // after them, through the page cache
  };

  // A free buffer of at least `bytes` (mutex held): a spare one, or a new one in place of
  // a spare that is too small.
  Buffer take(std::size_t bytes) {
    for (auto it = spare_.begin(); it != spare_.end(); ++it)
      if (it->capacity >= bytes) {
        Buffer b = std::move(*it);
        spare_.erase(it);
        return b;
      }
    if (!spare_.empty())
      spare_.pop_back();
    return allocate(bytes);
  }

  static Buffer allocate(std::size_t bytes) {
    const std::size_t capacity = whole_blocks(bytes);
    char* p = static_cast<char*>(std::aligned_alloc(kAlignment, capacity));
    if (p == nullptr)
      throw std::bad_alloc();
    return Buffer{std::unique_ptr<char, AlignedFree>(p), capacity};
  }

  // Writes one block: O_DIRECT, or through the page cache on a file system that opens
  // files O_DIRECT but refuses the writes (EINVAL), from then on. errno on failure. Lent
  // bytes that do not start on a block boundary in memory are copied into the thread's own
  // buffer first (O_DIRECT needs both ends aligned).
  bool write_block(const Job& job) {
    const off_t at = static_cast<off_t>(job.offset);
    const char* data = job.buffer.data.get();
    if (job.lent != nullptr) {
      data = job.lent;
      if (!cached_ && reinterpret_cast<std::uintptr_t>(data) % kAlignment != 0) {
        if (own_.capacity < job.bytes) {
          own_ = Buffer{};
          own_ = allocate(job.bytes);
        }
        std::memcpy(own_.data.get(), data, job.bytes);
        data = own_.data.get();
      }
    }
    if (!cached_) {
      if (write_all(direct_fd_, data, job.bytes, at))
        return true;
      if (errno != EINVAL)
        return false;
      cached_ = true;
    }
    return write_all(cached_fd_, data, job.bytes, at);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty())
        return; // stopped, nothing left
      Job job = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      // After a failure the file is lost: the rest is dropped.
      if (!failure_->failed() && job.bytes > 0 && !write_block(job))
        failure_->record(write_failed(job.bytes, job.offset, path_));
      if (!failure_->failed() && !job.tail.empty() &&
          !write_all(cached_fd_, job.tail.data(), job.tail.size(),
                     static_cast<off_t>(job.offset + job.bytes)))
        failure_->record(write_failed(job.tail.size(), job.offset + job.bytes, path_));
      if (job.lent != nullptr)
        slabs_->written(job.slab);
      lock.lock();
      if (job.buffer.data) {
        spare_.push_back(std::move(job.buffer));
        --in_use_;
      }
      writing_ = false;
      done_.notify_all();
    }
  }

  const int direct_fd_, cached_fd_;
  const std::string path_;
  Failure* const failure_;
  Slabs* const slabs_;
  Buffer own_; // the thread's: lent bytes not aligned in memory
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<Job> queue_;
  std::vector<Buffer> spare_;
  int in_use_ = 0;
  bool writing_ = false, stop_ = false, cached_ = false;
  std::thread thread_; // last: starts once the rest is constructed
};

// What use_driver hands HDF5 for the file access property list (copied by value).
struct DriverInfo {
  Failure* failure;
  Slabs* slabs; // or null
};

// The driver's file: HDF5's public part first, as every driver's.
struct DirectFile {
  H5FD_t pub;
  int fd;        // through the page cache
  int direct_fd; // O_DIRECT, or -1
  haddr_t eoa;   // end of the space HDF5 has allocated
  haddr_t eof;   // end of the file
  dev_t device;
  ino_t inode;
  std::string* path;
  Failure* failure;
  Slabs* slabs;       // or null
  DirectQueue* queue; // null without direct_fd
};

DirectFile* of(H5FD_t* file) {
  return reinterpret_cast<DirectFile*>(file);
}
const DirectFile* of(const H5FD_t* file) {
  return reinterpret_cast<const DirectFile*>(file);
}

void drain(DirectFile* f) {
  if (f->queue != nullptr)
    f->queue->drain();
}

H5FD_t* open_file(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  if (name == nullptr || *name == '\0' || maxaddr == 0 || maxaddr == HADDR_UNDEF ||
      info == nullptr || info->failure == nullptr) {
    push_error(H5E_BADVALUE, "no file name, no addresses, or no place for failures");
    return nullptr;
  }
  int o = O_CLOEXEC | ((flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY);
  if (flags & H5F_ACC_TRUNC)
    o |= O_TRUNC;
  if (flags & H5F_ACC_CREAT)
    o |= O_CREAT;
  if (flags & H5F_ACC_EXCL)
    o |= O_EXCL;
  const int fd = ::open(name, o, 0666);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    push_error(H5E_CANTOPENFILE, std::string("cannot open ") + name + ": " + std::strerror(errno));
    if (fd >= 0)
      ::close(fd);
    return nullptr;
  }
  int direct_fd = -1;
  if (flags & H5F_ACC_RDWR)
    direct_fd = ::open(name, O_WRONLY | O_DIRECT | O_CLOEXEC); // refused on some: -1
  auto* f = new DirectFile{};
  f->fd = fd;
  f->direct_fd = direct_fd;
  f->eoa = 0;
  f->eof = static_cast<haddr_t>(st.st_size);
  f->device = st.st_dev;
  f->inode = st.st_ino;
  f->path = new std::string(name);
  f->failure = info->failure;
  f->slabs = info->slabs;
  f->queue =
      direct_fd >= 0 ? new DirectQueue(direct_fd, fd, name, info->failure, info->slabs) : nullptr;
  return &f->pub;
}

herr_t close_file(H5FD_t* file) {
  DirectFile* f = of(file);
  drain(f);
  delete f->queue;
  if (f->direct_fd >= 0)
    ::close(f->direct_fd);
  if (::close(f->fd) != 0)
    f->failure->record("cannot close " + *f->path + ": " + std::strerror(errno));
  delete f->path;
  delete f;
  return 0;
}

int compare(const H5FD_t* a, const H5FD_t* b) {
  const DirectFile *x = of(a), *y = of(b);
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode)
    return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t query(const H5FD_t* /*file*/, unsigned long* flags) {
  if (flags != nullptr)
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t get_eoa(const H5FD_t* file, H5FD_mem_t /*type*/) {
  return of(file)->eoa;
}

herr_t set_eoa(H5FD_t* file, H5FD_mem_t /*type*/, haddr_t addr) {
  of(file)->eoa = addr;
  return 0;
}

haddr_t get_eof(const H5FD_t* file, H5FD_mem_t /*type*/) {
  return of(file)->eof;
}

herr_t get_handle(H5FD_t* file, hid_t /*fapl*/, void** handle) {
  if (handle == nullptr)
    return -1;
  *handle = &of(file)->fd;
  return 0;
}

herr_t read_file(H5FD_t* file, H5FD_mem_t /*type*/, hid_t /*dxpl*/, haddr_t addr, size_t size,
                 void* buffer) {
  DirectFile* f = of(file);
  drain(f);
  auto* out = static_cast<char*>(buffer);
  off_t at = static_cast<off_t>(addr);
  while (size > 0) {
    const ssize_t n = ::pread(f->fd, out, size, at);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      push_error(H5E_READERROR, "cannot read " + std::to_string(size) + " bytes at offset " +
                                    std::to_string(at) + " of " + *f->path + ": " +
                                    std::strerror(errno));
      return -1;
    }
    if (n == 0) { // past the end of the file: zeros, as HDF5's POSIX driver reads
      std::memset(out, 0, size);
      break;
    }
    out += n;
    at += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

herr_t write_file(H5FD_t* file, H5FD_mem_t type, hid_t /*dxpl*/, haddr_t addr, size_t size,
                  const void* buffer) {
  DirectFile* f = of(file);
  f->eof = std::max<haddr_t>(f->eof, addr + size);
  if (f->failure->failed())
    return 0; // dropped: see the top of this file
  const char* data = static_cast<const char*>(buffer);
  if (f->queue != nullptr) { // see the top of this file
    std::size_t direct = 0;  // a chunk's leading whole blocks
    if (type == H5FD_MEM_DRAW && addr % kAlignment == 0 && size >= kThreshold)
      direct = size / kAlignment * kAlignment;
    // From a slab: lent, but for its last whole block, copied with the partial one (Slabs).
    const int slab = direct > 0 && f->slabs != nullptr ? f->slabs->holding(data, size) : -1;
    if (slab >= 0)
      direct -= kAlignment;
    f->queue->push(addr, data, direct, size, slab);
    return 0;
  }
  if (!write_all(f->fd, data, size, static_cast<off_t>(addr)))
    f->failure->record(write_failed(size, addr, *f->path));
  return 0;
}

herr_t flush_file(H5FD_t* file, hid_t /*dxpl*/, hbool_t /*closing*/) {
  drain(of(file));
  return 0;
}

herr_t truncate_file(H5FD_t* file, hid_t /*dxpl*/, hbool_t /*closing*/) {
  DirectFile* f = of(file);
  drain(f);
  if (f->eoa == f->eof || f->failure->failed())
    return 0;
  if (::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0)
    f->failure->record("cannot set the size of " + *f->path + " to " + std::to_string(f->eoa) +
                       ": " + std::strerror(errno));
  f->eof = f->eoa;
  return 0;
}

// The file lock HDF5's POSIX driver takes, skipped where the file system has none.
herr_t lock_file(H5FD_t* file, hbool_t rw) {
  DirectFile* f = of(file);
  if (::flock(f->fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0 || errno == ENOSYS || errno == ENOLCK)
    return 0;
  push_error(H5E_CANTLOCKFILE, "cannot lock " + *f->path +
                                   " (is another process writing it?): " + std::strerror(errno));
  return -1;
}

herr_t unlock_file(H5FD_t* file) {
  ::flock(of(file)->fd, LOCK_UN); // closing the file releases it anyway
  return 0;
}

// The class's value where HDF5 asks for one (1.14 on): from the range it leaves to
// drivers outside the library, which HDF5 only checks is in range.
#ifdef H5FD_CLASS_VERSION
constexpr H5FD_class_value_t kClassValue = H5_VFD_RESERVED + 0xc1;
#endif

H5FD_class_t make_class() {
  H5FD_class_t c{};
#ifdef H5FD_CLASS_VERSION // HDF5 1.14 and 2.x: the class states its version and value
  c.version = H5FD_CLASS_VERSION;
  c.value = kClassValue;
#endif
  c.name = "cubelm_direct";
  c.maxaddr = (haddr_t(1) << (8 * sizeof(off_t) - 1)) - 1;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.fapl_size = sizeof(DriverInfo);
  c.open = open_file;
  c.close = close_file;
  c.cmp = compare;
  c.query = query;
  c.get_eoa = get_eoa;
  c.set_eoa = set_eoa;
  c.get_eof = get_eof;
  c.get_handle = get_handle;
  c.read = read_file;
  c.write = write_file;
  c.flush = flush_file;
  c.truncate = truncate_file;
  c.lock = lock_file;
  c.unlock = unlock_file;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::copy(map, map + H5FD_MEM_NTYPES, c.fl_map);
  return c;
}

// The driver's id, registered on first use (again if HDF5 was closed and reopened).
hid_t driver() {
  static std::mutex registering;
  static const H5FD_class_t cls = make_class();
  static hid_t id = -1;
  std::lock_guard<std::mutex> lock(registering);
  // Test hook: CUBELM_TEST_REFUSE_DRIVER=1 stands for an HDF5 that refuses the class.
  if (const char* refuse = std::getenv("CUBELM_TEST_REFUSE_DRIVER"); refuse && *refuse == '1') {
    push_error(H5E_BADVALUE, "refused for a test (CUBELM_TEST_REFUSE_DRIVER)");
    return -1;
  }
  if (id < 0 || H5Iis_valid(id) <= 0)
    id = H5FDregister(&cls);
  return id;
}

} // namespace

float* Slabs::next(std::size_t elements, std::size_t largest) {
  const auto blocks = [](std::size_t n) {
    return std::max(kAlignment, whole_blocks(n * sizeof(float)));
  };
  const std::uint64_t bytes = blocks(elements), ring = kCount * blocks(std::max(largest, elements));
  std::unique_lock<std::mutex> lock(mutex_);
  // The slab given before is the writer's no longer: free once the driver has written it.
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [&](const Slab& s) { return s.id == given_ && s.in_flight == 0; }),
              live_.end());
  given_ = -1;
  if (ring > capacity_) { // grown once all of it is written
    written_.wait(lock, [&] { return live_.empty(); });
    ring_.reset();
    capacity_ = 0;
    auto* p = static_cast<char*>(std::aligned_alloc(kAlignment, ring));
    if (p == nullptr)
      throw std::bad_alloc();
    ring_.reset(p);
    capacity_ = ring;
    head_ = 0;
  }
  // After the slab before, or from the start of the ring where it does not fit there;
  // the slabs in the way are written in the order they were given.
  const std::uint64_t at = head_ + bytes <= capacity_ ? head_ : 0;
  written_.wait(lock, [&] {
    return std::none_of(live_.begin(), live_.end(),
                        [&](const Slab& s) { return s.at < at + bytes && at < s.at + s.bytes; });
  });
  given_ = next_id_++;
  if (next_id_ < 0) // after 2^31 slabs
    next_id_ = 0;
  live_.push_back(Slab{given_, at, bytes, 0});
  head_ = at + bytes;
  return reinterpret_cast<float*>(ring_.get() + at);
}

Slabs::Slab* Slabs::find(int id) {
  for (Slab& s : live_)
    if (s.id == id)
      return &s;
  return nullptr;
}

void Slabs::settle() {
  std::unique_lock<std::mutex> lock(mutex_);
  written_.wait(lock, [&] {
    return std::all_of(live_.begin(), live_.end(), [](const Slab& s) { return s.in_flight == 0; });
  });
}

int Slabs::holding(const void* data, std::size_t bytes) const {
  const auto at = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto base = reinterpret_cast<std::uintptr_t>(ring_.get());
  for (const Slab& s : live_)
    if (base != 0 && at >= base + s.at && at + bytes <= base + s.at + s.bytes)
      return s.id;
  return -1;
}

void Slabs::queued(int i) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Slab* s = find(i))
    ++s->in_flight;
}

void Slabs::written(int i) {
  bool done = false; // the slab's last write: only then may a waiter go on
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Slab* s = find(i);
    done = s != nullptr && --s->in_flight == 0;
    if (done && s->id != given_)
      live_.erase(live_.begin() + (s - live_.data()));
  }
  if (done)
    written_.notify_all();
}

void use_driver(hid_t fapl, Failure* failure, Slabs* slabs) {
  hid_t id;
  {
    QuietHdf5 quiet; // a refusal is reported below
    id = driver();
  }
  if (id < 0) {
    // An HDF5 whose driver interface this build does not know: HDF5's POSIX driver writes
    // the same file, through the page cache. Said once per process.
    static std::once_flag said;
    const std::string why = cubelm::detail::hdf5_error_message();
    std::call_once(said, [&] {
      unsigned major = 0, minor = 0, release = 0;
      H5get_libversion(&major, &minor, &release);
      std::fprintf(stderr,
                   "cubelm: warning: HDF5 %u.%u.%u refused cubelm's checkpoint file driver (%s): "
                   "checkpoints are written through the page cache by HDF5's POSIX driver, "
                   "more slowly (docs/training.md#checkpoint-speed)\n",
                   major, minor, release, why.c_str());
    });
    CUBELM_HDF5_CHECK(H5Pset_fapl_sec2(fapl));
  } else {
    const DriverInfo info{failure, slabs};
    CUBELM_HDF5_CHECK(H5Pset_driver(fapl, id, &info));
  }
  CUBELM_HDF5_CHECK(H5Pset_alignment(fapl, kThreshold, kAlignment));
}

std::uint64_t buffer_bytes(std::uint64_t largest_chunk) {
  if (largest_chunk < kThreshold)
    return 0;
  return (kBuffers + 1) * whole_blocks(largest_chunk);
}

} // namespace cubelm::io::direct
