#include "cubelm/train/metrics.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/core/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cubelm::train {

std::string format_duration(double seconds) {
  char buf[48];
  const long long s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", s / 3600, s / 60 % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%llds", s);
  return buf;
}

std::string format_step(const StepMetrics& m, int steps, double eta_s) {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "step %d/%d | loss %.4f | gnorm %.2f | lr %.1e | %.0f ms | %s tok/s | %.1f "
                "GFLOP/s/rank | MFU %.0f%% | mem %.0f MiB/rank",
                m.step, steps, m.loss, m.grad_norm, m.lr, m.ms, si(m.tokens_per_s, 1).c_str(),
                m.gflops_per_rank, 100.0 * m.mfu, m.mem_bytes / 1048576.0);
  std::string line = buf;
  if (m.moe) {
    std::snprintf(buf, sizeof(buf), " | aux %.4f", m.aux_loss);
    line.insert(line.find(" | gnorm"), buf);
  }
  if (m.val_loss) {
    std::snprintf(buf, sizeof(buf), " | val %.4f", *m.val_loss);
    line.insert(line.find(" | gnorm"), buf);
  }
  if (eta_s >= 0)
    line += " | ETA " + format_duration(eta_s);
  if (m.skipped)
    line += std::isfinite(m.loss) ? " | skipped (non-finite gradient norm)"
                                  : " | skipped (non-finite loss)";
  return line;
}

void accumulate(TimeSplit& sum, const TimeSplit& step) {
  const auto add = [](Spread& a, const Spread& b) {
    a.mean += b.mean;
    a.max += b.max;
  };
  add(sum.ms, step.ms);
  add(sum.compute_ms, step.compute_ms);
  add(sum.idle_ms, step.idle_ms);
  for (const auto& [group, spread] : step.comm_ms) {
    auto it = std::find_if(sum.comm_ms.begin(), sum.comm_ms.end(),
                           [&](const auto& e) { return e.first == group; });
    if (it == sum.comm_ms.end())
      sum.comm_ms.emplace_back(group, spread);
    else
      add(it->second, spread);
  }
}

std::string format_time_split(const TimeSplit& sum, int steps) {
  if (steps <= 0)
    return "";
  char buf[160];
  std::string text = "time per step over " + std::to_string(steps) +
                     " steps, mean over ranks / slowest rank (docs/perf-runs.md):\n";
  const double step = sum.ms.mean / steps;
  const auto line = [&](const std::string& what, const Spread& s) {
    std::snprintf(buf, sizeof(buf), "  %-16s %10.2f / %10.2f ms  %5.1f%%\n", what.c_str(),
                  s.mean / steps, s.max / steps, step > 0 ? 100.0 * s.mean / steps / step : 0.0);
    text += buf;
  };
  line("step", sum.ms);
  line("compute", sum.compute_ms);
  if (sum.idle_ms.max > 0)
    line("idle (pipeline)", sum.idle_ms);
  for (const auto& [group, spread] : sum.comm_ms)
    if (spread.max > 0)
      line("comm " + group, spread);
  return text;
}

namespace {
// JSON has no NaN or infinity: a non-finite number is written as null.
struct Number {
  double x;
};
std::ostream& operator<<(std::ostream& out, Number n) {
  if (std::isfinite(n.x))
    return out << n.x;
  return out << "null";
}
// {"mean": .., "max": ..}
std::ostream& operator<<(std::ostream& out, const Spread& s) {
  return out << "{\"mean\": " << Number{s.mean} << ", \"max\": " << Number{s.max} << "}";
}
} // namespace

std::string format_json(const StepMetrics& m) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"step\": " << m.step << ", \"loss\": " << Number{m.loss}
      << (m.moe ? ", \"aux_loss\": " : "");
  if (m.moe)
    out << Number{m.aux_loss};
  if (m.val_loss)
    out << ", \"val_loss\": " << Number{*m.val_loss} << ", \"val_ms\": " << m.val_ms;
  out << ", \"grad_norm\": " << Number{m.grad_norm} << ", \"lr\": " << m.lr << ", \"ms\": " << m.ms
      << ", \"tokens_per_s\": " << m.tokens_per_s << ", \"gflops_per_rank\": " << m.gflops_per_rank
      << ", \"mfu\": " << m.mfu << ", \"peak_gflops\": " << m.peak_gflops
      << ", \"peak_share\": " << m.peak_share << ", \"peak_threads\": " << m.peak_threads
      << ", \"mem_bytes\": " << m.mem_bytes << ", \"comm_bytes\": " << m.comm_bytes
      << ", \"wait_ms\": " << m.wait_ms << ", \"compute_ms\": " << m.time.compute_ms
      << ", \"comm_ms\": {";
  for (std::size_t i = 0; i < m.time.comm_ms.size(); ++i)
    out << (i == 0 ? "" : ", ") << "\"" << m.time.comm_ms[i].first
        << "\": " << m.time.comm_ms[i].second;
  out << "}, \"idle_ms\": " << m.time.idle_ms << ", \"step_ms\": " << m.time.ms
      << ", \"skipped\": " << (m.skipped ? "true" : "false");
  if (m.checkpoint_ms >= 0)
    out << ", \"checkpoint_ms\": " << m.checkpoint_ms
        << ", \"checkpoint_wait_ms\": " << m.checkpoint_wait_ms;
  if (!m.background.path.empty())
    out << ", \"checkpoint_written\": {\"step\": " << m.background.step
        << ", \"write_s\": " << m.background.seconds
        << ", \"ok\": " << (m.background.error.empty() ? "true" : "false") << "}";
  out << ", \"comm\": {";
  bool first = true;
  for (const auto& e : m.traffic) {
    if (e.calls == 0)
      continue;
    out << (first ? "" : ", ") << "\"" << e.group << "." << comm::kind_name(e.kind)
        << "\": {\"calls\": " << e.calls << ", \"bytes\": " << e.bytes << "}";
    first = false;
  }
  out << "}}";
  return out.str();
}

void drop_metrics_from(const std::string& path, int step) {
  std::ifstream in(path);
  if (!in)
    return;
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    int s = -1;
    if (std::sscanf(line.c_str(), "{\"step\": %d", &s) == 1 && s >= step) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  if (!dropped)
    return;
  const std::string temporary = path + ".tmp";
  std::ofstream out(temporary, std::ios::trunc);
  out << kept;
  out.close();
  if (!out || std::rename(temporary.c_str(), path.c_str()) != 0)
    throw Error("log.metrics = \"" + path + "\": cannot rewrite the file without the steps from " +
                    std::to_string(step) + " on (they are repeated after resuming)",
                true);
}

} // namespace cubelm::train
