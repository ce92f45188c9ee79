#include "cubelm/core/stop.hpp"

#include "cubelm/core/error.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cubelm {

namespace {

volatile std::sig_atomic_t g_received = 0;

extern "C" void on_stop_signal(int signal) {
  if (g_received == 0)
    g_received = signal;
}

constexpr int kStopSignals[] = {SIGTERM, SIGUSR1};
struct sigaction g_previous[2];
bool g_installed = false;

} // namespace

StopSignals::StopSignals() {
  CUBELM_ASSERT(!g_installed, "StopSignals: only one may be alive at a time");
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Interrupted system calls restart: MPI and file I/O carry on to the step boundary.
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < 2; ++i)
    sigaction(kStopSignals[i], &action, &g_previous[i]);
  g_received = 0;
  g_installed = true;
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 2; ++i)
    sigaction(kStopSignals[i], &g_previous[i], nullptr);
  g_installed = false;
}

int StopSignals::received() {
  return g_received;
}

void StopSignals::clear() {
  g_received = 0;
}

std::string signal_name(int signal) {
  switch (signal) {
  case SIGTERM:
    return "SIGTERM";
  case SIGUSR1:
    return "SIGUSR1";
  case SIGUSR2:
    return "SIGUSR2";
  case SIGINT:
    return "SIGINT";
  default:
    return "signal " + std::to_string(signal);
  }
}

EndTime end_time_from_environment(const char* (*get)(const char*)) {
  if (get == nullptr)
    get = [](const char* name) -> const char* { return std::getenv(name); };
  EndTime out;
  for (const char* name : {"SLURM_JOB_END_TIME", kEndTimeVariable}) {
    const char* text = get(name);
    if (text == nullptr || *text == '\0')
      continue;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (*end != '\0' || value <= 0)
      throw Error(std::string(name) + " = \"" + text +
                      "\": the job's end time must be a positive whole number of seconds since "
                      "the epoch (as `date +%s` prints it)",
                  true);
    if (out.epoch_s == 0 || static_cast<double>(value) < out.epoch_s) {
      out.epoch_s = static_cast<double>(value);
      out.source = name;
    }
  }
  return out;
}

Deadline::Deadline(double time_limit_s, Clock::time_point start, const EndTime& end,
                   double checkpoint_bytes)
    : checkpoint_bytes_(checkpoint_bytes) {
  const auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  if (time_limit_s > 0) {
    limited_ = true;
    end_ = start + seconds(time_limit_s);
    char text[64];
    std::snprintf(text, sizeof(text), "train.time_limit_s = %g", time_limit_s);
    source_ = text;
  }
  if (end.epoch_s > 0) {
    // The job's end on this clock: its distance from now on the wall clock.
    const double wall_now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const Clock::time_point job_end = Clock::now() + seconds(end.epoch_s - wall_now);
    if (!limited_ || job_end < end_) {
      limited_ = true;
      end_ = job_end;
      source_ = "the job's end time (" + end.source + ")";
    }
  }
}

double Deadline::seconds_left(Clock::time_point now) const {
  if (!limited_)
    return 1e300;
  return std::chrono::duration<double>(end_ - now).count();
}

bool Deadline::too_near(double reserve_s, Clock::time_point now) const {
  return limited_ && seconds_left(now) < reserve_s;
}

double Deadline::save_estimate(double longest_save_s) const {
  return std::max(longest_save_s, checkpoint_bytes_ / kAssumedWriteRate);
}

std::string Deadline::describe() const {
  if (!limited_)
    return "none";
  char text[64];
  std::snprintf(text, sizeof(text), " (ends in %.0f s)", seconds_left());
  return source_ + text;
}

} // namespace cubelm
