// `cubelm plan`: printing the ranked layouts, and measuring a machine for its file.

#include "cubelm/app/plan.hpp"

#include "cubelm/comm/grid.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/format.hpp"
#include "cubelm/core/memory_info.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/planner.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/precision.hpp"

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <unistd.h>

namespace cubelm::app {

namespace {

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (const char c : s)
    q += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

std::string ms(double seconds) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), seconds < 1 ? "%.2f ms" : "%.3f s",
                seconds < 1 ? seconds * 1e3 : seconds);
  return buf;
}

cost::SearchSpace search_space(const PlanOptions& o) {
  cost::SearchSpace space;
  for (const std::string& p : o.precisions) {
    const auto v = parse_precision(p);
    if (!v)
      throw Error("--precision " + p + ": must be fp32, tf32 or bf16", true);
    space.precisions.push_back(*v);
  }
  for (const std::string& m : o.modes) {
    const auto v = parse_mode(m);
    if (!v)
      throw Error("--mode " + m + ": must be none, 1d, 2d or 3d", true);
    space.modes.push_back(*v);
  }
  for (const std::string& r : o.recompute) {
    const auto v = parse_recompute(r);
    if (!v)
      throw Error("--recompute " + r + ": must be none or full", true);
    space.recompute.push_back(*v);
  }
  space.tensor_sizes = o.tensor_sizes;
  space.context_sizes = o.context_sizes;
  space.pipeline_sizes = o.pipeline_sizes;
  return space;
}

} // namespace

std::string prediction_json(const Deck& deck, const cost::Prediction& p) {
  const ParallelConfig& l = deck.parallel;
  std::ostringstream out;
  out.precision(10);
  out << "{\"layout\": {\"tensor_mode\": " << quoted(mode_name(l.tensor_mode))
      << ", \"tensor_size\": " << l.tensor_size << ", \"pipeline_size\": " << l.pipeline_size
      << ", \"data_size\": " << l.data_size
      << ", \"schedule\": " << quoted(schedule_name(l.schedule))
      << ", \"virtual_stages\": " << l.virtual_stages << ", \"microbatches\": " << l.microbatches
      << ", \"zero\": " << l.zero
      << ", \"sequence_parallel\": " << (l.sequence_parallel ? "true" : "false")
      << ", \"recompute\": " << quoted(recompute_name(l.recompute))
      << "}, \"precision\": " << quoted(precision_name(deck.train.precision))
      << ", \"step_ms\": " << p.step_s * 1e3 << ", \"mem_bytes\": " << p.memory.total()
      << ", \"comm_bytes\": " << p.comm_bytes << ", \"fits\": " << (p.fits ? "true" : "false")
      << ", \"compute_ms\": " << p.compute_s * 1e3 << ", \"idle_ms\": " << p.idle_s * 1e3
      << ", \"optimizer_ms\": " << p.optimizer_s * 1e3 << ", \"comm_ms\": {";
  bool first = true;
  for (const auto& [group, s] : p.comm_s) {
    out << (first ? "" : ", ") << quoted(group) << ": " << s * 1e3;
    first = false;
  }
  out << "}, \"memory\": {\"parameters\": " << p.memory.parameters
      << ", \"gradients\": " << p.memory.gradients << ", \"optimizer\": " << p.memory.optimizer
      << ", \"activations\": " << p.memory.activations << "}, \"comm\": {";
  std::map<std::string, double> by_group;
  for (const auto& v : p.stage_traffic.front())
    by_group[v.group] += v.bytes;
  first = true;
  for (const auto& [group, bytes] : by_group) {
    out << (first ? "" : ", ") << quoted(group) << ": " << bytes;
    first = false;
  }
  out << "}, \"tflops_per_device\": " << p.tflops_per_device << ", \"mfu\": " << p.mfu
      << ", \"critical_stage\": " << p.critical_stage
      << ", \"checkpoint_bytes\": " << p.checkpoint_bytes
      << ", \"checkpoint_ms\": " << p.checkpoint_s * 1e3
      << ", \"checkpoint_step_ms\": " << p.checkpoint_step_s * 1e3 << ", \"bubble\": [";
  for (std::size_t s = 0; s < p.unit_bubble.size(); ++s)
    out << (s ? ", " : "") << p.unit_bubble[s];
  out << "]}";
  return out.str();
}

std::string prediction_text(const Deck& deck, const cost::Prediction& p,
                            const io::Machine& machine) {
  std::ostringstream out;
  const int ranks = comm::layout_of(deck.parallel).world_size();
  const int nodes = (ranks + machine.devices_per_node - 1) / machine.devices_per_node;
  char buf[300];
  std::snprintf(buf, sizeof(buf),
                "predicted  %s per step on %d device%s of %s (%d node%s): %.3g TFLOP/s per "
                "device, MFU %.0f%% (%s)\n",
                ms(p.step_s).c_str(), ranks, ranks == 1 ? "" : "s", machine.name.c_str(), nodes,
                nodes == 1 ? "" : "s", p.tflops_per_device, 100 * p.mfu,
                precision_name(deck.train.precision));
  out << buf << "  time     compute " << ms(p.compute_s);
  for (const auto& [group, s] : p.comm_s)
    out << ", comm " << group << " " << ms(s);
  out << ", idle (pipeline) " << ms(p.idle_s) << ", optimizer " << ms(p.optimizer_s);
  if (p.checkpoint_step_s > 0)
    out << ", checkpoints " << ms(p.checkpoint_step_s);
  out << " (stage " << p.critical_stage << ")\n";
  out << "  saves    " << format_bytes(p.checkpoint_bytes) << " per checkpoint";
  if (p.checkpoint_s > 0) {
    char rate[120];
    std::snprintf(rate, sizeof(rate), ", written in %s at %.3g GB/s (machine.checkpoint_gbs): ",
                  ms(p.checkpoint_s).c_str(), machine.checkpoint_gbs);
    out << rate << ms(p.checkpoint_step_s) << " per step over the " << cost::steps_per_save(deck)
        << " steps "
        << (deck.checkpoint.interval > 0 ? "between saves" : "before the save at the end") << "\n";
  } else {
    out << "; write time not predicted: the machine file has no machine.checkpoint_gbs "
           "(`cubelm plan --calibrate` measures it)\n";
  }
  out << "  memory   " << format_bytes(static_cast<double>(p.memory.total())) << " per rank of "
      << machine.memory_gib << " GiB: " << (p.fits ? "fits" : "does NOT fit") << "\n";
  std::map<std::string, double> by_group;
  for (const auto& v : p.stage_traffic.front())
    by_group[v.group] += v.bytes;
  out << "  traffic  rank 0 per step:";
  bool any = false;
  for (const auto& [group, bytes] : by_group)
    if (bytes > 0) { // a group of one rank sends nothing
      out << " " << group << " " << format_bytes(bytes);
      any = true;
    }
  out << (any ? "\n" : " none\n");
  return out.str();
}

int run_plan(const PlanOptions& o, const Environment& env) {
  if (o.calibrate)
    return run_calibrate(o, env);
  if (o.machine.empty())
    throw Error("cubelm plan needs --machine FILE (a machine file: docs/planner.md; "
                "`cubelm plan --calibrate -o FILE` measures this one)",
                true);
  const Deck deck = cost::load_deck(o.deck);
  const io::Machine machine = io::load_machine(o.machine);
  const int ranks = o.ranks > 0 ? o.ranks : comm::layout_of(deck.parallel).world_size();
  if (o.ranks < 0)
    throw Error("--ranks = " + std::to_string(o.ranks) + ": must be at least 1", true);
  if (o.top < 1)
    throw Error("--top = " + std::to_string(o.top) + ": must be at least 1", true);
  const cost::Ranking ranking = cost::rank_layouts(deck, ranks, machine, search_space(o));
  const std::vector<cost::Candidate>& all = ranking.fit;
  if (env.world_rank() != 0)
    return 0;
  const char* why_none =
      ranking.considered == 0
          ? "the model's shapes (heads, hidden, layers) and train.global_batch do not split over "
            "these ranks"
          : "every layout needs more memory per device than the machine has; add ranks or lower "
            "train.global_batch";
  if (o.json) {
    for (const auto& c : all)
      std::printf("%s\n", prediction_json(c.deck, c.prediction).c_str());
    if (all.empty()) // nothing on standard output: say why on standard error
      std::fprintf(stderr, "cubelm plan: no layout fits (%zu considered): %s (docs/planner.md)\n",
                   ranking.considered, why_none);
    return all.empty() ? 1 : 0;
  }
  const int nodes = (ranks + machine.devices_per_node - 1) / machine.devices_per_node;
  std::printf("plan       %s on %d rank%s of %s (%d node%s of %d): %zu layouts, %zu fit in "
              "%.4g GiB per device\n",
              o.deck.c_str(), ranks, ranks == 1 ? "" : "s", machine.name.c_str(), nodes,
              nodes == 1 ? "" : "s", machine.devices_per_node, ranking.considered, all.size(),
              machine.memory_gib);
  if (all.empty()) {
    std::printf("no layout fits: %s (docs/planner.md)\n", why_none);
    return 1;
  }
  std::printf("%4s %11s %8s %5s %11s %11s %7s  %s\n", "rank", "step", "TFLOP/s", "MFU", "mem/rank",
              "comm/rank", "bubble", "layout");
  const std::size_t shown = std::min(all.size(), static_cast<std::size_t>(o.top));
  for (std::size_t i = 0; i < shown; ++i) {
    const cost::Prediction& p = all[i].prediction;
    const double bubble = *std::max_element(p.unit_bubble.begin(), p.unit_bubble.end());
    std::printf("%4zu %11s %8.3g %4.0f%% %11s %11s %7.3f  %s%s\n", i + 1, ms(p.step_s).c_str(),
                p.tflops_per_device, 100 * p.mfu,
                format_bytes(static_cast<double>(p.memory.total())).c_str(),
                format_bytes(p.comm_bytes).c_str(), bubble, cost::layout_line(all[i].deck).c_str(),
                "");
  }
  std::printf("best       %s\n%s", cost::layout_line(all.front().deck).c_str(),
              prediction_text(all.front().deck, all.front().prediction, machine).c_str());
  return 0;
}

} // namespace cubelm::app
