#pragma once
// A pool of library handles that are costly to create (CUDA events): acquire()
// hands out a spare one, or creates one when none is spare; release() takes it
// back for the next acquire(). The pool destroys its spare handles when it goes,
// so it must outlive the handles it gave out: Pooled holds one handle and the
// pool (a shared_ptr) until it gives the handle back.
// Thread-safe: the watchdog's thread gives back events the main thread took.
// Kept free of CUDA so that its bookkeeping is tested on any machine
// (tests/comm/test_streams.cpp).

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace cubelm::comm::detail {

template <class Handle>
class HandlePool {
public:
  HandlePool(std::function<Handle()> create, std::function<void(Handle)> destroy)
      : create_(std::move(create)), destroy_(std::move(destroy)) {}
  ~HandlePool() {
    for (Handle h : spare_)
      destroy_(h);
  }
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;

  /// A spare handle (the one given back last), or a new one.
  Handle acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!spare_.empty()) {
        Handle h = spare_.back();
        spare_.pop_back();
        return h;
      }
      ++created_;
    }
    return create_();
  }
  /// Takes `handle` (from acquire()) back for reuse.
  void release(Handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.push_back(handle);
  }
  /// Handles created so far: the most ever out at once.
  std::size_t created() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return created_;
  }
  /// Handles waiting for reuse.
  std::size_t spare() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return spare_.size();
  }

private:
  std::function<Handle()> create_;
  std::function<void(Handle)> destroy_;
  mutable std::mutex mutex_;
  std::vector<Handle> spare_;
  std::size_t created_ = 0;
};

/// One handle of a pool for as long as it lives (shared by the operations of a batch).
template <class Handle>
class Pooled {
public:
  explicit Pooled(std::shared_ptr<HandlePool<Handle>> pool)
      : pool_(std::move(pool)), handle_(pool_->acquire()) {}
  ~Pooled() { pool_->release(handle_); }
  Pooled(const Pooled&) = delete;
  Pooled& operator=(const Pooled&) = delete;
  Handle get() const { return handle_; }

private:
  std::shared_ptr<HandlePool<Handle>> pool_;
  Handle handle_;
};

} // namespace cubelm::comm::detail
