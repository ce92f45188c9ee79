#include "cubelm/train/metrics.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/core/format.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cubelm::train {

std::string format_step(const StepMetrics& m, int steps) {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "step %d/%d | loss %.4f | gnorm %.2f | lr %.1e | %.0f ms | %s tok/s | %.1f "
                "GFLOP/s/rank | MFU %.0f%% | mem %.0f MiB/rank",
                m.step, steps, m.loss, m.grad_norm, m.lr, m.ms, si(m.tokens_per_s, 1).c_str(),
                m.gflops_per_rank, 100.0 * m.mfu, m.mem_bytes / 1048576.0);
  std::string line = buf;
  if (m.skipped)
    line += std::isfinite(m.loss) ? " | skipped (non-finite gradient norm)"
                                  : " | skipped (non-finite loss)";
  return line;
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
} // namespace

std::string format_json(const StepMetrics& m) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"step\": " << m.step << ", \"loss\": " << Number{m.loss}
      << ", \"grad_norm\": " << Number{m.grad_norm} << ", \"lr\": " << m.lr << ", \"ms\": " << m.ms
      << ", \"tokens_per_s\": " << m.tokens_per_s << ", \"gflops_per_rank\": " << m.gflops_per_rank
      << ", \"mfu\": " << m.mfu << ", \"mem_bytes\": " << m.mem_bytes
      << ", \"comm_bytes\": " << m.comm_bytes << ", \"wait_ms\": " << m.wait_ms
      << ", \"skipped\": " << (m.skipped ? "true" : "false") << ", \"comm\": {";
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
