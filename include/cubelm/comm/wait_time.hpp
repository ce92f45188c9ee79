#pragma once
/// \file
/// \brief Time the thread that talks to MPI spends blocked in communication, by group.
///
/// Every blocking collective, point-to-point call and Request wait of comm is a
/// watchdog::Scope (comm/watchdog.hpp); the outermost Scope of the thread also
/// adds its duration to its group's total here (nested Scopes are part of it).
/// Two clock reads per wait, whether the watchdog is armed or not. On a GPU a
/// call that only enqueues work (NCCL) returns at once: its time is counted
/// where the host later waits for the stream, unless CommOptions::fence_timing
/// makes the blocking calls fence before and after (docs/perf-runs.md).

#include <string>
#include <utility>
#include <vector>

namespace cubelm::comm::wait_time {

/// \brief Seconds spent so far in blocking waits on `group`, since the process began.
double seconds(const std::string& group);

/// \brief Every group waited on so far, with its seconds.
std::vector<std::pair<std::string, double>> all();

} // namespace cubelm::comm::wait_time
