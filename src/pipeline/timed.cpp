// The timeline of a plan with per-pass costs and message delays, in flat arrays (plans
// of thousands of micro-batches). pipeline::simulate is this with unit costs, its passes
// recorded; tests/pipeline/test_schedule.cpp checks it against the schedules' closed forms.

#include "cubelm/pipeline/timed.hpp"

#include "cubelm/core/error.hpp"

#include <algorithm>
#include <string>

namespace cubelm::pipeline {

PassCosts unit_costs(const PipelinePlan& plan, double forward_cost, double backward_cost) {
  PassCosts c;
  for (const auto& chunks : plan.layers_of) {
    c.forward.emplace_back();
    c.backward.emplace_back();
    for (const auto& layers : chunks) {
      c.forward.back().push_back(static_cast<double>(layers.size()) * forward_cost);
      c.backward.back().push_back(static_cast<double>(layers.size()) * backward_cost);
    }
  }
  c.to_next.assign(static_cast<std::size_t>(plan.stages), 0.0);
  c.to_prev.assign(static_cast<std::size_t>(plan.stages), 0.0);
  return c;
}

TimedTimeline simulate_timed(const PipelinePlan& plan, const PassCosts& costs,
                             std::vector<std::vector<Interval>>* passes) {
  const int p = plan.stages, vs = plan.virtual_stages(), m = plan.micro;
  const auto P = static_cast<std::size_t>(p);
  // End times per (virtual stage, micro-batch); -1 while not run.
  std::vector<double> fwd_end(static_cast<std::size_t>(vs) * static_cast<std::size_t>(m), -1.0);
  std::vector<double> bwd_end(fwd_end.size(), -1.0);
  const auto at = [m](int k, int micro) {
    return static_cast<std::size_t>(k) * static_cast<std::size_t>(m) +
           static_cast<std::size_t>(micro);
  };
  TimedTimeline t;
  t.busy.assign(P, 0.0);
  t.idle.assign(P, 0.0);
  t.done.assign(P, 0.0);
  for (const auto& chunks : plan.layers_of) {
    t.last_backward_start.emplace_back(chunks.size(), 0.0);
    t.last_backward_end.emplace_back(chunks.size(), 0.0);
  }
  if (passes != nullptr)
    passes->assign(P, {});
  std::vector<std::size_t> next(P, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto si = static_cast<std::size_t>(s);
      const auto& actions = plan.actions[si];
      while (next[si] < actions.size()) {
        const Action& a = actions[next[si]];
        const int k = plan.virtual_stage(s, a.chunk);
        const auto ci = static_cast<std::size_t>(a.chunk);
        double ready = t.done[si];
        if (a.op == Op::forward) {
          if (k > 0) {
            const double e = fwd_end[at(k - 1, a.micro)];
            if (e < 0)
              break; // wait for another stage
            // The previous virtual stage ran on stage s - 1 (mod p), or here (one stage).
            const int from = (s + p - 1) % p;
            ready =
                std::max(ready, e + (p > 1 ? costs.to_next[static_cast<std::size_t>(from)] : 0));
          }
        } else if (k == vs - 1) {
          const double e = fwd_end[at(k, a.micro)];
          if (e < 0)
            break;
          ready = std::max(ready, e);
        } else {
          const double e = bwd_end[at(k + 1, a.micro)];
          if (e < 0)
            break;
          const int from = (s + 1) % p;
          ready = std::max(ready, e + (p > 1 ? costs.to_prev[static_cast<std::size_t>(from)] : 0));
        }
        const bool forward = a.op == Op::forward;
        const double length = forward ? costs.forward[si][ci] : costs.backward[si][ci];
        if (!forward && a.last_backward) {
          t.last_backward_start[si][ci] = ready;
          t.last_backward_end[si][ci] = ready + length;
        }
        if (passes != nullptr)
          (*passes)[si].push_back(
              {forward ? Interval::forward : Interval::backward, a.micro, a.chunk, ready, length});
        t.done[si] = ready + length;
        t.busy[si] += length;
        (forward ? fwd_end : bwd_end)[at(k, a.micro)] = t.done[si];
        ++next[si];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    CUBELM_ASSERT(next[static_cast<std::size_t>(s)] ==
                      plan.actions[static_cast<std::size_t>(s)].size(),
                  "pipeline schedule '" + std::string(schedule_name(plan.schedule)) +
                      "' deadlocks at stage " + std::to_string(s));
  for (const double d : t.done)
    t.makespan = std::max(t.makespan, d);
  for (std::size_t s = 0; s < P; ++s)
    t.idle[s] = t.makespan - t.busy[s];
  return t;
}

} // namespace cubelm::pipeline
