#pragma once
/// \file
/// \brief The hang watchdog: a blocking collective or point-to-point wait that
/// makes no progress for `parallel.timeout_s` seconds is reported and the whole
/// job is aborted (docs/reliability.md, "Hang watchdog").
///
/// Three parts:
///  - comm::Watchdog arms the process-wide monitor while it lives: a thread that
///    sleeps and wakes a few times a second (at most every 0.5 s).
///  - watchdog::Scope marks a blocking wait of the thread that talks to MPI
///    (Group's blocking calls, Request::wait): the group, the operation and
///    when the wait began, in atomics the monitor reads. It costs one clock read
///    (no system call on Linux) and a few atomic stores; unarmed, one load.
///  - watchdog::set_step and watchdog::set_micro_batch: where training is, for
///    the message.
/// When a wait has lasted longer than the timeout, the monitor prints one line,
///   cubelm: rank 2: no progress for 3.1 s in all_reduce on group 'tp' (step 3,
///   micro-batch 0); parallel.timeout_s = 3; aborting the job
/// and calls MPI_Abort(MPI_COMM_WORLD, watchdog::kExitCode) from its own
/// thread (see watchdog.cpp for why that is sound here).

#include <string>

namespace cubelm::comm {

/// \brief Arms the process-wide hang watchdog with `timeout_s` seconds while it
/// lives; `timeout_s` <= 0 arms nothing (the watchdog stays off).
///
/// Construct and destroy it on the thread that talks to MPI, after MPI_Init.
/// Several may live at once (the shortest timeout applies); the monitor thread
/// runs while at least one armed Watchdog does.
class Watchdog {
public:
  explicit Watchdog(double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// \brief The timeout this one asked for (0: off).
  double timeout_s() const { return timeout_s_; }

private:
  double timeout_s_ = 0;
};

namespace watchdog {

/// \brief The status with which the watchdog ends the job (MPI_Abort's error
/// code; mpirun exits with it). 124, as GNU `timeout` does for a command that
/// timed out.
constexpr int kExitCode = 124;

/// \brief True while a Watchdog with a positive timeout lives.
bool armed();
/// \brief The timeout in force (the shortest of the armed Watchdogs), 0 when off.
double timeout_s();

/// \brief The training step the rank is in (negative: before the first step).
void set_step(int step);
/// \brief The micro-batch the rank is in (negative: none, e.g. the gradient
/// reduction and the update after the micro-batches).
void set_micro_batch(int micro);

/// \brief A name that lives as long as the process, equal names giving the same
/// pointer: what a Scope may hold after the group that named it is gone.
const char* intern(const std::string& name);

/// \brief Marks a blocking wait in `op` ("all_reduce", "irecv", ...) on group
/// `group` (an intern()ed name) from construction to destruction.
///
/// For the thread that talks to MPI (or a SecondThread). Scopes nest: the inner one is watched
/// until it ends, then the outer one again (from its own start).
class Scope {
public:
  Scope(const char* group, const char* op) noexcept;
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

private:
  bool active_ = false;
  const char* group_ = nullptr; // the enclosing scope's, restored at the end
  const char* op_ = nullptr;
  long long since_ = 0;
};

/// \brief Marks the calling thread, while it lives, as the process's second thread that
/// talks to MPI (the background checkpoint writer under MPI_THREAD_MULTIPLE): its
/// Scopes are watched apart from the main thread's, a stall there is reported as the
/// writer's, and its waits add nothing to comm/wait_time.hpp. One at a time (a second
/// is an InternalError); construct it first thing in the thread, destroy it last.
class SecondThread {
public:
  SecondThread();
  ~SecondThread();
  SecondThread(const SecondThread&) = delete;
  SecondThread& operator=(const SecondThread&) = delete;
};

/// \brief What the monitor would report now, for tests and diagnostics.
struct Wait {
  const char* group = nullptr; ///< nullptr: no wait in progress
  const char* op = nullptr;
  double seconds = 0; ///< how long it has lasted
  int step = -1;
  int micro = -1;
};
/// \brief The main thread's blocking wait in progress, if any (group == nullptr otherwise).
Wait current();

/// \brief A stuck or failed operation as the message names it.
struct Stall {
  int rank = -1;
  const char* group = "?";
  const char* op = "?";
  double seconds = 0; ///< time without progress
  int step = -1;
  int micro = -1;
  double timeout_s = 0;
  /// Where it is stuck when not in a host wait, e.g. "on the GPU (NCCL)".
  std::string where;
  /// A library's error instead of a timeout (e.g. NCCL's asynchronous error); empty for a timeout.
  std::string error;
};

/// \brief The one line printed for `stall` (without a newline).
std::string describe(const Stall& stall);

/// \brief Prints describe(stall), runs the abort hooks of the comm backends
/// (ncclCommAbort) and aborts the job with kExitCode; callable from any thread,
/// once per process (a second caller waits for the first to end the job).
[[noreturn]] void abort_job(Stall stall);

} // namespace watchdog
} // namespace cubelm::comm
