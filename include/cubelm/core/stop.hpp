#pragma once
/// \file
/// \brief Stopping a run early, on purpose: the signals a batch system sends
/// before it ends a job (SIGTERM, SIGUSR1) and the job's end time. `cubelm train`
/// checks both at every step boundary, all ranks agree, and the run writes a
/// checkpoint and exits with kExitStopped (docs/reliability.md#walltime-and-signals).

#include <chrono>
#include <string>

namespace cubelm {

/// \brief Exit status of a run that stopped early after writing its checkpoint
/// (EX_TEMPFAIL of sysexits.h: "try again"); resubmit it with checkpoint.resume = "auto".
constexpr int kExitStopped = 75;

/// \brief Environment variable with the job's end as seconds since the epoch, for
/// schedulers that do not publish it themselves.
constexpr const char* kEndTimeVariable = "CUBELM_END_TIME";

/// \brief While alive, SIGTERM and SIGUSR1 set a flag instead of ending the
/// process; the previous handlers come back on destruction. One at a time.
class StopSignals {
public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// \brief The first stop signal received since construction, or 0.
  static int received();
  /// \brief For tests: forget a received signal.
  static void clear();
};

/// \brief "SIGTERM", "SIGUSR1", ... or "signal N".
std::string signal_name(int signal);

/// \brief The job's end time announced by the environment.
struct EndTime {
  double epoch_s = 0; ///< seconds since the epoch; 0 when none is announced
  std::string source; ///< the variable it came from, e.g. "SLURM_JOB_END_TIME"
};

/// \brief Reads SLURM_JOB_END_TIME (Slurm 23.02 and later) and CUBELM_END_TIME
/// (seconds since the epoch, set by a batch script) through `get` (std::getenv
/// by default) and returns the earlier. A value that is not a positive whole
/// number is an Error naming the variable and the value.
EndTime end_time_from_environment(const char* (*get)(const char*) = nullptr);

/// \brief Write rate assumed for a checkpoint before one has been timed (bytes/s).
constexpr double kAssumedWriteRate = 100e6;

/// \brief When a run must have written its last checkpoint: the earlier of its own
/// time limit (train.time_limit_s after `start`) and the job's end time.
class Deadline {
public:
  using Clock = std::chrono::steady_clock;
  /// \brief `time_limit_s` = 0 and no `end`: no deadline. `checkpoint_bytes` is the
  /// size of one checkpoint, for save_estimate before any has been timed.
  Deadline(double time_limit_s, Clock::time_point start, const EndTime& end,
           double checkpoint_bytes);

  bool limited() const { return limited_; }
  /// \brief Seconds left at `now` (negative once past; huge when not limited).
  double seconds_left(Clock::time_point now = Clock::now()) const;
  /// \brief True when less than `reserve_s` seconds are left.
  bool too_near(double reserve_s, Clock::time_point now = Clock::now()) const;
  /// \brief Seconds a checkpoint may take: the longest one timed so far, and at least
  /// its size at kAssumedWriteRate.
  double save_estimate(double longest_save_s) const;
  /// \brief E.g. "train.time_limit_s = 600 (ends in 600 s)".
  std::string describe() const;

private:
  bool limited_ = false;
  Clock::time_point end_;
  std::string source_;
  double checkpoint_bytes_ = 0;
};

} // namespace cubelm
