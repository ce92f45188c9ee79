#pragma once
/// \file
/// \brief A pipeline plan's timeline with real costs: each (stage, chunk) pass takes its
/// own time and each message between stages its own delay. The unit-cost timeline of
/// pipeline/schedule.hpp is the special case of costs proportional to the layers and no
/// delays; `cubelm plan` uses this one to predict a step (docs/planner.md).
///
/// Pure arithmetic: no MPI, no Kokkos.

#include "cubelm/pipeline/schedule.hpp"

#include <vector>

namespace cubelm::pipeline {

/// \brief What each pass and message of a plan costs, in any unit of time.
struct PassCosts {
  std::vector<std::vector<double>> forward;  ///< [stage][chunk]: one micro-batch's forward
  std::vector<std::vector<double>> backward; ///< [stage][chunk]: its backward
  /// [stage]: delay of a message from stage s to stage s + 1 (mod p), and to s - 1.
  std::vector<double> to_next, to_prev;
};

/// \brief The costs of the unit-cost model: n layers cost n f forward and n b backward.
PassCosts unit_costs(const PipelinePlan& plan, double forward_cost = 1.0,
                     double backward_cost = 2.0);

/// \brief Each stage's busy time, when it is done, and when its chunks' last backward ran.
struct TimedTimeline {
  double makespan = 0;
  std::vector<double> busy, idle; ///< [stage]; idle = makespan - busy
  std::vector<double> done;       ///< [stage]: the end of its last action
  /// [stage][chunk]: start and end of the chunk's last backward (its gradients complete
  /// in it: data parallelism may reduce them from then on).
  std::vector<std::vector<double>> last_backward_start, last_backward_end;
};

/// \brief Runs `plan` as pipeline::simulate does (each stage its actions in order, an action
/// starting when the stage is free and its input has arrived) with `costs`: a forward's
/// input arrives `to_next` after the previous virtual stage's forward ended on another
/// stage, a backward's `to_prev` after the next one's backward. InternalError if the
/// plan cannot finish. With `passes`, each stage's passes in time order (no idle
/// gaps; pipeline::simulate adds them).
TimedTimeline simulate_timed(const PipelinePlan& plan, const PassCosts& costs,
                             std::vector<std::vector<Interval>>* passes = nullptr);

} // namespace cubelm::pipeline
