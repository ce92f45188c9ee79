#pragma once
/// \file
/// \brief What one optimizer step did, as printed by rank 0 and written to the
/// JSON-lines metrics file (docs/training.md).

#include "cubelm/comm/traffic.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::train {

/// \brief Reasons to stop after a step: on one rank (Trainer::vote_stop) a yes or
/// no each; in StepMetrics::stop the number of ranks that said yes.
struct StopVotes {
  int sigterm = 0;  ///< SIGTERM received
  int sigusr1 = 0;  ///< SIGUSR1 received
  int deadline = 0; ///< the time limit or the job's end is too near for another step
  bool any() const { return sigterm + sigusr1 + deadline > 0; }
};

/// \brief What one optimizer step did (the keys of the JSON-lines metrics).
struct StepMetrics {
  int step = 0;
  double loss = 0;      ///< mean cross-entropy over the global batch
  double grad_norm = 0; ///< global L2 norm before clipping
  double lr = 0;
  double ms = 0;
  double tokens_per_s = 0;
  double gflops_per_rank = 0;
  double mfu = 0;
  std::int64_t mem_bytes = 0;
  double comm_bytes = 0; ///< modelled bytes this rank sent in the step
  double wait_ms = 0;    ///< wall-clock time this rank waited for other pipeline stages
  /// the loss or the gradient norm was not finite: no AdamW update (docs/reliability.md)
  bool skipped = false;
  /// ranks that asked to stop after this step, by reason (not written to the metrics)
  StopVotes stop;
  std::vector<comm::TrafficEntry> traffic; ///< the same per group and collective kind
};

/// \brief "step 12/200 | loss 2.8311 | ..." as printed by rank 0.
std::string format_step(const StepMetrics& m, int steps);
/// \brief One JSON object on one line.
std::string format_json(const StepMetrics& m);
/// \brief Removes from the JSON-lines file `path` the lines of steps >= `step` (a run
/// resumed from step `step` writes them again); a missing file is left missing. The
/// file is rewritten through a temporary file and a rename, so it is never half-written.
void drop_metrics_from(const std::string& path, int step);

} // namespace cubelm::train
