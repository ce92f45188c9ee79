#pragma once
/// \file
/// \brief What one optimizer step did, as printed by rank 0 and written to the
/// JSON-lines metrics file (docs/training.md).

#include "cubelm/comm/traffic.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
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

/// \brief What became of one background checkpoint write (checkpoint.async).
struct BackgroundResult {
  std::string path;      ///< the checkpoint written (final name)
  std::string error;     ///< "" when it was committed; else why not, naming the file
  double seconds = 0;    ///< the writer's time, from start to commit
  std::int64_t step = 0; ///< the steps the checkpoint holds
};

/// \brief A quantity of every rank: its mean and its largest value over the ranks.
struct Spread {
  double mean = 0;
  double max = 0;
};

/// \brief Where a step's wall-clock time went on each rank (docs/perf-runs.md): waiting
/// in each group's communication, waiting for other pipeline stages, and the rest.
struct TimeSplit {
  Spread ms;         ///< the step's wall-clock time
  Spread compute_ms; ///< ms minus the waits below: kernels, host work, launches
  Spread idle_ms;    ///< waiting for other pipeline stages (group pp: bubble and transfers)
  /// waiting in each other group's collectives and point-to-point calls (exposed
  /// communication), by group name, in the grid's order
  std::vector<std::pair<std::string, Spread>> comm_ms;
};

/// \brief What one optimizer step did (the keys of the JSON-lines metrics).
struct StepMetrics {
  int step = 0;
  double loss = 0; ///< mean cross-entropy over the global batch
  /// the model has MoE layers: aux_loss is printed and written to the metrics
  bool moe = false;
  /// the MoE layers' load-balancing loss (docs/model.md), mean over the micro-batches;
  /// the step trains on loss + aux_loss
  double aux_loss = 0;
  double grad_norm = 0; ///< global L2 norm before clipping
  /// the validation loss after this step (Trainer::validate), when one was computed
  std::optional<double> val_loss;
  double val_ms = 0; ///< the milliseconds the validation took (not in ms)
  double lr = 0;
  double ms = 0;
  double tokens_per_s = 0;
  double gflops_per_rank = 0;
  /// the model's FLOP rate over the peak (never above 1: a step faster than the peak
  /// raises the peak to its own rate, and `peak_raised` says so)
  double mfu = 0;
  double peak_gflops = 0;   ///< the per-rank peak MFU is measured against; 0: none
  bool peak_raised = false; ///< this step ran above the peak, which is now its rate
  /// the rank's share of the node the peak was measured on (core/peak.hpp): the
  /// peak is the node's rate alone times this; 1 when the deck gives the peak
  double peak_share = 1;
  /// host threads the node's rate was measured with (1 in a device build, or when
  /// the deck gives the peak): a report divides by them for a rate per CPU
  int peak_threads = 1;
  std::int64_t mem_bytes = 0;
  double comm_bytes = 0; ///< modelled bytes this rank sent in the step
  double wait_ms = 0;    ///< wall-clock time this rank waited for other pipeline stages
  TimeSplit time;        ///< over all ranks
  /// the loss or the gradient norm was not finite: no AdamW update (docs/reliability.md)
  bool skipped = false;
  /// ranks that asked to stop after this step, by reason (not written to the metrics)
  StopVotes stop;
  /// a checkpoint was taken after this step: the milliseconds the training loop spent
  /// on it (a synchronous save: all of it; a background one: waiting for the write in
  /// flight, then copying to host buffers); negative: none
  double checkpoint_ms = -1;
  double checkpoint_wait_ms = 0; ///< of checkpoint_ms, waiting for the write in flight
  /// a background write that every rank finished during this step (path empty: none)
  BackgroundResult background;
  std::vector<comm::TrafficEntry> traffic; ///< the same per group and collective kind
};

/// \brief "step 12/200 | loss 2.8311 | ..." as printed by rank 0, ending with
/// "| ETA 3m05s" when `eta_s` (the time the remaining steps will take) is not negative.
std::string format_step(const StepMetrics& m, int steps, double eta_s = -1);
/// \brief "42s", "3m05s", "2h07m".
std::string format_duration(double seconds);
/// \brief Adds a step's time split to a sum over steps (means and maxima added up).
void accumulate(TimeSplit& sum, const TimeSplit& step);
/// \brief The summary lines of a sum over `steps` steps: per step, mean over ranks and
/// the slowest rank, and each part's share of the mean step.
std::string format_time_split(const TimeSplit& sum, int steps);
/// \brief One JSON object on one line.
std::string format_json(const StepMetrics& m);
/// \brief Removes from the JSON-lines file `path` the lines of steps >= `step` (a run
/// resumed from step `step` writes them again); a missing file is left missing. The
/// file is rewritten through a temporary file and a rename, so it is never half-written.
void drop_metrics_from(const std::string& path, int step);

} // namespace cubelm::train
