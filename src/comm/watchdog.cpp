// The hang watchdog (comm/watchdog.hpp, docs/reliability.md).
//
// Why the monitor thread may call MPI_Abort although MPI runs at
// MPI_THREAD_FUNNELED: the main thread is, by then, stuck inside an MPI call
// (or a CUDA synchronisation behind a stuck NCCL kernel) and will never return
// to make the call itself, and no standard-conforming way exists to interrupt it. MPI_Abort is the
// one call whose only job is to end every process of the job, including ones that are stopped or
// deadlocked; Open MPI (4.1, checked by the cli_hang_* tests) carries it out from any thread (the
// request goes to the launcher's daemon, which kills the job). Raising the thread level to
// MPI_THREAD_MULTIPLE would make every MPI call of the training loop pay for locks to cover this
// one call. Should MPI_Abort still not end this process, a backstop thread exits it
// kAbortGraceSeconds later with kExitCode, and the launcher then ends the others (an MPI process
// that exits without MPI_Finalize brings its job down).

#include "cubelm/comm/watchdog.hpp"
#include "cubelm/comm/wait_time.hpp"

#include "cubelm/core/error.hpp"

#include "watchdog_detail.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace cubelm::comm {

namespace watchdog {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kAbortGraceSeconds = 5;

// The blocking wait of a thread that talks to MPI: written by Scope (group and op
// first, then `since` with release), read by the monitor (`since` with acquire, then
// group and op, then `since` again to see that they belong together). Slot 0 is the
// main thread's; slot 1 a second thread's (watchdog::SecondThread: the background
// checkpoint writer). The wait-time fields are written and read by the slot's thread only.
struct Slot {
  std::atomic<const char*> group{nullptr};
  std::atomic<const char*> op{nullptr};
  std::atomic<long long> since{0}; // steady-clock ns when the wait began; 0: no wait
  // Time in blocking waits (comm/wait_time.hpp): the outermost Scope, main thread only.
  int wait_depth = 0;
  const char* wait_group = nullptr;
  long long wait_start = 0;
};
Slot g_slots[2];
thread_local Slot* t_slot = &g_slots[0];
std::atomic<bool> g_second_taken{false};
std::atomic<int> g_step{-1};
std::atomic<int> g_micro{-1};
std::atomic<bool> g_armed{false};

// The seconds of each group (interned names: equal names, equal pointers), written and
// read by the main thread only.
std::vector<std::pair<const char*, double>>& wait_totals() {
  static std::vector<std::pair<const char*, double>> totals = [] {
    std::vector<std::pair<const char*, double>> v;
    v.reserve(64); // the groups of a grid and the checkpoint's: no allocation in a Scope
    return v;
  }();
  return totals;
}
void add_wait(const char* group, long long ns) noexcept {
  auto& totals = wait_totals();
  for (auto& [name, seconds] : totals)
    if (name == group) {
      seconds += static_cast<double>(ns) * 1e-9;
      return;
    }
  if (totals.size() < totals.capacity())
    totals.emplace_back(group, static_cast<double>(ns) * 1e-9);
}
std::atomic<double> g_timeout{0.0};

struct Monitor {
  std::mutex mutex; // guards everything below but `watched`
  std::condition_variable wake;
  std::multiset<double> timeouts; // of the armed Watchdogs
  std::thread thread;
  bool stop = false;
  int rank = -1;

  std::timed_mutex watched_mutex;
  std::vector<detail::Watched*> watched;

  std::mutex names_mutex;
  std::set<std::string> names;
};

// Never destroyed: a backend may unregister after static destruction has begun.
Monitor& monitor() {
  static Monitor* m = new Monitor;
  return *m;
}

// Sleeps between checks: a tenth of the timeout, within [10 ms, 500 ms].
std::chrono::milliseconds tick(double timeout_s) {
  const double ms = std::min(500.0, std::max(10.0, timeout_s * 100.0));
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

// One look at the main thread's wait and at the backends' work in flight; time
// before `not_before` (ns) does not count.
void check(double timeout_s, long long not_before) {
  for (const Slot& slot : g_slots) {
    const long long since = slot.since.load(std::memory_order_acquire);
    if (since == 0)
      continue;
    const double waited =
        static_cast<double>(detail::now_ns() - std::max(since, not_before)) * 1e-9;
    if (waited > timeout_s) {
      Stall s;
      s.group = slot.group.load(std::memory_order_relaxed);
      s.op = slot.op.load(std::memory_order_relaxed);
      if (slot.since.load(std::memory_order_acquire) == since) { // still the same wait
        s.rank = detail::rank();
        s.seconds = waited;
        s.step = detail::step();
        s.micro = detail::micro_batch();
        s.timeout_s = timeout_s;
        if (&slot != &g_slots[0])
          s.where = "(the background checkpoint writer)";
        abort_job(s);
      }
    }
  }
  // A library error first, else the longest stall: work of several communicators
  // on one stream queues behind the oldest stuck operation, which is the one to name.
  std::optional<Stall> found;
  {
    Monitor& m = monitor();
    std::lock_guard<std::timed_mutex> lock(m.watched_mutex);
    for (detail::Watched* w : m.watched) {
      std::optional<Stall> s = w->poll(timeout_s, not_before);
      if (!s)
        continue;
      if (!found || (!s->error.empty() && found->error.empty()) ||
          (s->error.empty() == found->error.empty() && s->seconds > found->seconds))
        found = std::move(s);
    }
  }
  if (found)
    abort_job(*found); // with the registry unlocked: abort_job takes it for the hooks
}

// A tick that comes this much later than asked means the process was stopped
// (SIGSTOP, a debugger, a batch system suspending the job) or starved.
constexpr long long kPauseNs = 1000000000;

void run() {
  Monitor& m = monitor();
  std::unique_lock<std::mutex> lock(m.mutex);
  long long last = detail::now_ns();
  long long not_before = 0;
  while (!m.stop) {
    const std::chrono::milliseconds pause = tick(*m.timeouts.begin());
    m.wake.wait_for(lock, pause);
    if (m.stop)
      break;
    lock.unlock();
    // After a pause of this process every wait restarts its clock: a rank that
    // was stopped has not seen its partners fail to make progress, and a job
    // that was suspended as a whole is not hung.
    const long long now = detail::now_ns();
    if (now - last > std::chrono::nanoseconds(pause).count() + kPauseNs)
      not_before = now;
    last = now;
    check(g_timeout.load(), not_before);
    lock.lock();
  }
}

const char* or_unknown(const char* text) {
  return text != nullptr ? text : "?";
}

} // namespace

bool armed() {
  return g_armed.load(std::memory_order_relaxed);
}

double timeout_s() {
  return g_timeout.load();
}

void set_step(int step) {
  g_step.store(step, std::memory_order_relaxed);
}

void set_micro_batch(int micro) {
  g_micro.store(micro, std::memory_order_relaxed);
}

const char* intern(const std::string& name) {
  Monitor& m = monitor();
  std::lock_guard<std::mutex> lock(m.names_mutex);
  return m.names.insert(name).first->c_str(); // std::set never moves its elements
}

Scope::Scope(const char* group, const char* op) noexcept {
  Slot& slot = *t_slot;
  if (&slot == &g_slots[0] && slot.wait_depth++ == 0) {
    slot.wait_group = group;
    slot.wait_start = detail::now_ns();
  }
  if (!g_armed.load(std::memory_order_relaxed))
    return;
  active_ = true;
  since_ = slot.since.load(std::memory_order_relaxed);
  if (since_ != 0) {
    group_ = slot.group.load(std::memory_order_relaxed);
    op_ = slot.op.load(std::memory_order_relaxed);
  }
  slot.group.store(group, std::memory_order_relaxed);
  slot.op.store(op, std::memory_order_relaxed);
  slot.since.store(detail::now_ns(), std::memory_order_release);
}

Scope::~Scope() {
  Slot& slot = *t_slot;
  if (&slot == &g_slots[0] && --slot.wait_depth == 0)
    add_wait(slot.wait_group, detail::now_ns() - slot.wait_start);
  if (!active_)
    return;
  if (since_ == 0) {
    slot.since.store(0, std::memory_order_release);
    return;
  }
  // Back in the enclosing wait; the inner one completed, so its clock restarts.
  slot.group.store(group_, std::memory_order_relaxed);
  slot.op.store(op_, std::memory_order_relaxed);
  slot.since.store(detail::now_ns(), std::memory_order_release);
}

SecondThread::SecondThread() {
  if (g_second_taken.exchange(true))
    throw InternalError("watchdog::SecondThread: a second thread already talks to MPI");
  t_slot = &g_slots[1];
}

SecondThread::~SecondThread() {
  g_slots[1].since.store(0, std::memory_order_release);
  t_slot = &g_slots[0];
  g_second_taken.store(false);
}

Wait current() {
  Wait w;
  const Slot& slot = g_slots[0];
  const long long since = slot.since.load(std::memory_order_acquire);
  if (since == 0)
    return w;
  w.group = or_unknown(slot.group.load(std::memory_order_relaxed));
  w.op = or_unknown(slot.op.load(std::memory_order_relaxed));
  w.seconds = static_cast<double>(detail::now_ns() - since) * 1e-9;
  w.step = detail::step();
  w.micro = detail::micro_batch();
  return w;
}

std::string describe(const Stall& s) {
  char buf[160];
  std::string line = "cubelm: rank " + std::to_string(s.rank) + ": ";
  if (s.error.empty()) {
    std::snprintf(buf, sizeof(buf), "no progress for %.1f s in ", s.seconds);
    line += buf;
  } else {
    line += s.error + " in ";
  }
  line += std::string(or_unknown(s.op)) + " on group '" + or_unknown(s.group) + "'";
  if (!s.where.empty())
    line += " " + s.where;
  if (s.step < 0)
    line += " (before the first step)";
  else if (s.micro < 0)
    line += " (step " + std::to_string(s.step) + ", outside the micro-batches)";
  else
    line += " (step " + std::to_string(s.step) + ", micro-batch " + std::to_string(s.micro) + ")";
  if (s.error.empty()) {
    std::snprintf(buf, sizeof(buf), "; parallel.timeout_s = %g", s.timeout_s);
    line += buf;
  }
  return line + "; aborting the job";
}

void abort_job(Stall stall) {
  static std::atomic<bool> started{false};
  if (started.exchange(true)) // another thread is ending the job already
    for (;;)
      std::this_thread::sleep_for(std::chrono::seconds(1));
  if (stall.rank < 0)
    stall.rank = detail::rank();
  if (stall.rank < 0) // never armed: a backend reports on the thread that talks to MPI
    stall.rank = cubelm::detail::world_rank_or_minus_one();
  const std::string line = describe(stall);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  try {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
      std::fprintf(stderr,
                   "cubelm: MPI_Abort did not end this process within %d s; exiting with "
                   "status %d\n",
                   kAbortGraceSeconds, kExitCode);
      std::fflush(stderr);
      std::_Exit(kExitCode);
    }).detach();
  } catch (...) {
    // No thread for the backstop: MPI_Abort alone has to do.
  }
  Monitor& m = monitor();
  std::unique_lock<std::timed_mutex> lock(m.watched_mutex, std::defer_lock);
  if (lock.try_lock_for(std::chrono::seconds(1)))
    for (detail::Watched* w : m.watched)
      w->abort();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized)
    MPI_Abort(MPI_COMM_WORLD, kExitCode);
  std::_Exit(kExitCode);
}

namespace detail {

void add(Watched* watched) {
  Monitor& m = monitor();
  std::lock_guard<std::timed_mutex> lock(m.watched_mutex);
  m.watched.push_back(watched);
}

void remove(Watched* watched) {
  Monitor& m = monitor();
  std::lock_guard<std::timed_mutex> lock(m.watched_mutex);
  m.watched.erase(std::remove(m.watched.begin(), m.watched.end(), watched), m.watched.end());
}

long long now_ns() {
  // steady_clock reads the vDSO clock on Linux: no system call.
  const long long ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return ns != 0 ? ns : 1; // 0 means "no wait"
}

int step() {
  return g_step.load(std::memory_order_relaxed);
}

int micro_batch() {
  return g_micro.load(std::memory_order_relaxed);
}

int rank() {
  Monitor& m = monitor();
  std::lock_guard<std::mutex> lock(m.mutex);
  return m.rank;
}

} // namespace detail
} // namespace watchdog

Watchdog::Watchdog(double timeout_s) : timeout_s_(timeout_s > 0 ? timeout_s : 0.0) {
  if (timeout_s_ <= 0)
    return;
  watchdog::Monitor& m = watchdog::monitor();
  const int rank = cubelm::detail::world_rank_or_minus_one();
  std::lock_guard<std::mutex> lock(m.mutex);
  if (rank >= 0)
    m.rank = rank;
  m.timeouts.insert(timeout_s_);
  watchdog::g_timeout.store(*m.timeouts.begin());
  watchdog::g_armed.store(true, std::memory_order_relaxed);
  if (!m.thread.joinable()) {
    m.stop = false;
    m.thread = std::thread(watchdog::run);
  } else {
    m.wake.notify_all(); // a shorter timeout wants a shorter tick
  }
}

Watchdog::~Watchdog() {
  if (timeout_s_ <= 0)
    return;
  watchdog::Monitor& m = watchdog::monitor();
  std::thread finished;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.timeouts.erase(m.timeouts.find(timeout_s_));
    if (m.timeouts.empty()) {
      watchdog::g_armed.store(false, std::memory_order_relaxed);
      watchdog::g_timeout.store(0.0);
      m.stop = true;
      finished = std::move(m.thread);
    } else {
      watchdog::g_timeout.store(*m.timeouts.begin());
    }
  }
  m.wake.notify_all();
  if (finished.joinable())
    finished.join();
}

namespace wait_time {

double seconds(const std::string& group) {
  for (const auto& [name, secs] : watchdog::wait_totals())
    if (name != nullptr && group == name)
      return secs;
  return 0.0;
}

std::vector<std::pair<std::string, double>> all() {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, secs] : watchdog::wait_totals())
    out.emplace_back(name != nullptr ? name : "?", secs);
  return out;
}

} // namespace wait_time

} // namespace cubelm::comm
