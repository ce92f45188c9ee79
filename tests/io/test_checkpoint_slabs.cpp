// The one writer's ring of slabs (src/io/checkpoint_direct.hpp), against a driver thread
// that writes what it is lent later than the writer fills the next slabs: a slab is never
// given while a write from the memory it takes is queued, so what the driver writes is
// what the writer put there.

#include "checkpoint_direct.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

using cubelm::io::direct::kAlignment;
using cubelm::io::direct::Slabs;

// Stands for the file driver's thread: takes the writes lent from slabs in order, after a
// pause of its own, checks that the memory still holds the value the writer filled it
// with, and hands it back.
class Driver {
public:
  explicit Driver(Slabs& slabs) : slabs_(slabs), thread_([this] { run(); }) {}
  ~Driver() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void lend(int slab, const float* data, std::size_t elements, float value) {
    slabs_.queued(slab);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Write{slab, data, elements, value});
    }
    wake_.notify_all();
  }

  // Waits until every write lent so far is done.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return queue_.empty() && !writing_; });
  }

  int wrong() const { return wrong_; }

private:
  struct Write {
    int slab;
    const float* data;
    std::size_t elements;
    float value;
  };

  void run() {
    std::mt19937 random(7);
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty())
        return;
      const Write w = queue_.front();
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
      for (std::size_t i = 0; i < w.elements; ++i)
        if (w.data[i] != w.value) {
          ++wrong_;
          break;
        }
      slabs_.written(w.slab);
      lock.lock();
      writing_ = false;
      done_.notify_all();
    }
  }

  Slabs& slabs_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<Write> queue_;
  bool stop_ = false, writing_ = false;
  std::atomic<int> wrong_{0};
  std::thread thread_; // last: starts once the rest is constructed
};

TEST(CheckpointSlabs, NoSlabIsGivenWhileTheDriverHoldsItsMemory) {
  Slabs slabs;
  Driver driver(slabs);
  std::mt19937 random(11);
  int given = 0;
  // Slabs of up to 1000 floats, then the ring grows for slabs of up to 5000: far more than
  // the ring holds, so that it wraps around many times while the driver lags behind.
  for (const std::size_t largest : {std::size_t{1000}, std::size_t{5000}}) {
    for (int n = 0; n < 400; ++n, ++given) {
      const std::size_t elements = 1 + random() % largest;
      float* slab = slabs.next(elements, largest);
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(slab) % kAlignment, 0u);
      const float value = static_cast<float>(given);
      const int id = slabs.holding(slab, elements * sizeof(float));
      ASSERT_GE(id, 0);
      EXPECT_EQ(slabs.holding(slab + elements, kAlignment + sizeof(float)), -1)
          << "past the slab's last block";
      // A slab lends nothing (small chunks, copied by the driver), one part or several,
      // each lent once filled (as the writer hands a slab's chunks over one by one); the
      // slab stays the writer's while the driver is done with the parts before.
      const std::size_t parts = random() % 4;
      std::fill(slab, slab + elements, value);
      for (std::size_t p = 0; p < parts; ++p) {
        const std::size_t from = elements * p / parts, to = elements * (p + 1) / parts;
        ASSERT_EQ(slabs.holding(slab + from, (to - from) * sizeof(float)), id);
        driver.lend(id, slab + from, to - from, value);
        if (n % 8 == 0)
          driver.drain();
      }
    }
  }
  slabs.settle();
  EXPECT_EQ(driver.wrong(), 0) << "a slab was given while the driver still read its memory";
}

} // namespace
