#pragma once
// The watchdog's hooks for the comm backends: what the monitor thread checks
// besides the blocking waits of the main thread, and what it releases before it
// aborts the job. Only the comm layer sees this.

#include "cubelm/comm/watchdog.hpp"

#include <optional>

namespace cubelm::comm::watchdog::detail {

/// \brief Work that can hang where no Scope sees it, e.g. NCCL collectives on a
/// GPU stream that a later fence outside comm waits for.
class Watched {
public:
  virtual ~Watched() = default;
  /// \brief On the monitor thread at every tick while the watchdog is armed: a
  /// stall to report (older than `timeout_s`, or a library error), or nothing.
  /// Time before `not_before` (now_ns() units) does not count: this process was
  /// stopped then.
  virtual std::optional<Stall> poll(double timeout_s, long long not_before) = 0;
  /// \brief On the thread that aborts the job, before MPI_Abort: lets the
  /// library give up what it waits for (ncclCommAbort). Must not throw.
  virtual void abort() noexcept = 0;
};

/// \brief Registers `watched` until remove(); poll() and abort() may run on
/// another thread from now on.
void add(Watched* watched);
/// \brief Unregisters `watched`; once it returns no call to it is running or will run.
void remove(Watched* watched);

/// \brief The monotonic clock the watchdog uses, in nanoseconds.
long long now_ns();
/// \brief The training step and micro-batch last set (watchdog::set_step, set_micro_batch).
int step();
int micro_batch();
/// \brief The world rank recorded when the watchdog was first armed (-1 before).
int rank();

} // namespace cubelm::comm::watchdog::detail
