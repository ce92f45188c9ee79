#include "cubelm/train/background_save.hpp"

#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/error.hpp"

#include <chrono>
#include <csignal>
#include <exception>
#include <pthread.h>
#include <utility>

namespace cubelm::train {

BackgroundSaves::BackgroundSaves(const comm::Communicator& comm) {
  CUBELM_ASSERT(comm::threads_may_call_mpi(),
                "BackgroundSaves: MPI does not run at MPI_THREAD_MULTIPLE");
  comm_ = comm::Communicator::duplicate(comm.raw());
}

BackgroundSaves::~BackgroundSaves() {
  if (thread_.joinable())
    thread_.join();
}

void BackgroundSaves::start(const std::string& path, std::function<void()> after_commit) {
  CUBELM_ASSERT(!thread_.joinable(), "BackgroundSaves::start: a write is still in flight");
  finished_.store(false, std::memory_order_release);
  result_ = BackgroundResult{};
  result_.path = path;
  result_.step = snapshot_.step();
  // The writer takes no signal: SIGTERM and SIGUSR1 are the main thread's to see, and
  // none interrupts the writer's system calls.
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &before);
  try {
    thread_ = std::thread([this, path, after = std::move(after_commit)] {
      const auto begin = std::chrono::steady_clock::now();
      try {
        const comm::watchdog::SecondThread watched;
        snapshot_.write(path, comm_);
        if (after)
          after();
      } catch (const std::exception& e) {
        result_.error = e.what();
      } catch (...) {
        result_.error = "checkpoint " + path + ": the background writer failed";
      }
      result_.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      finished_.store(true, std::memory_order_release);
    });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
}

BackgroundResult BackgroundSaves::wait() {
  CUBELM_ASSERT(thread_.joinable(), "BackgroundSaves::wait: no write in flight");
  thread_.join();
  return result_;
}

} // namespace cubelm::train
