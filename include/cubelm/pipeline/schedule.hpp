#pragma once
/// \file
/// \brief Pipeline schedules (docs/pipeline.md): which layers each stage holds,
/// the order of its forward and backward passes, and their timeline under a
/// unit-cost model (no wall clock).
///
/// The model is cut into virtual stages k = chunk * p + stage (p stages, each
/// holding `chunks` chunks); activations flow from virtual stage k to k + 1, so
/// chunk c of the last stage feeds chunk c + 1 of the first. F(micro, k) needs
/// F(micro, k - 1); B(micro, k) needs B(micro, k + 1) (the last virtual stage:
/// its own forward).
///  - gpipe: one chunk of contiguous layers per stage; every forward, then every
///    backward, in micro-batch order.
///  - 1f1b: PipeDream-Flush: stage s runs min(p - s - 1, m) warm-up forwards, then
///    one forward and one backward in turn, then the remaining backwards.
///  - interleaved: Megatron-LM's interleaved 1F1B with v chunks of L / (p v)
///    contiguous layers per stage (needs m % p == 0 and L % (p v) == 0).
///  - layered: the modular pipeline: layer l on stage l % p, a chunk each; every
///    micro-batch passes a layer before the next layer starts, forward and
///    backward. With p = 1 it is layered gradient accumulation.

///
/// A plan also owns the activation slots: the buffers, one per (micro-batch,
/// chunk) in flight, that a stage's model keeps between a chunk's forward and its
/// backward. The plan says which slot each action uses and when it is free again.
///
/// Pure arithmetic: no MPI, no Kokkos, so `cubelm check` and the planner use it.

#include "cubelm/core/config.hpp"

#include <string>
#include <vector>

namespace cubelm::pipeline {

enum class Op { forward, backward };

/// \brief One pass of one micro-batch through one of the stage's chunks.
struct Action {
  Op op;
  int micro; ///< micro-batch, 0 .. m - 1
  int chunk; ///< the stage's chunk, 0 .. its chunk count - 1
  int slot;  ///< activation slot of (micro, chunk): the lowest free one at its forward
  bool last_backward = false; ///< the chunk's gradient is complete after this backward
  /// Forward, previous chunk on this rank (one stage): the slot holding its output, copied
  /// into this slot's input; else -1.
  int input_from = -1;
  /// Backward, next chunk on this rank (one stage): the slot whose input gradient is this
  /// backward's output gradient, freed after it; else -1.
  int grad_from = -1;
  /// The slot freed after this action, or -1. A backward frees its own slot unless the
  /// previous chunk is on this rank: that chunk's backward reads the input gradient
  /// left in it first (and frees it: grad_from).
  int frees = -1;
};

/// \brief Every stage's layers and actions for one optimizer step.
struct PipelinePlan {
  Schedule schedule = Schedule::one_f_one_b;
  int stages = 1, micro = 1, chunks = 1, layers = 1;    ///< p, m, chunks per stage (most), L
  std::vector<std::vector<Action>> actions;             ///< [stage], in execution order
  std::vector<std::vector<std::vector<int>>> layers_of; ///< [stage][chunk]: layer ids
  std::vector<int> slots; ///< [stage]: activation slots it needs (the most busy at once)

  /// \brief Position of (stage, chunk) along the model.
  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }
  /// \brief The model's previous chunk is on the same rank: one stage holding several chunks.
  bool local_prev(int chunk) const { return stages == 1 && chunk > 0; }
  /// \brief The model's next chunk is on the same rank.
  bool local_next(int stage, int chunk) const {
    return stages == 1 &&
           chunk + 1 < static_cast<int>(layers_of[static_cast<std::size_t>(stage)].size());
  }
  /// \brief Virtual stages of the model.
  int virtual_stages() const;
  /// \brief (stage, chunk) holds the embedding lookup (virtual stage 0).
  bool first(int stage, int chunk) const { return virtual_stage(stage, chunk) == 0; }
  /// \brief (stage, chunk) holds ln_f and the head (the last virtual stage).
  bool last(int stage, int chunk) const {
    return virtual_stage(stage, chunk) == virtual_stages() - 1;
  }
};

/// \brief The deck key, its value and the rule a combination breaks (empty key: none).
struct PlanProblem {
  std::string key, value, rule;
  std::string message() const { return key + " = " + value + ": " + rule; }
};
PlanProblem check_plan(Schedule schedule, int stages, int micro, int virtual_stages, int layers);

/// \brief The plan of `schedule` (Error naming the deck key when check_plan fails).
PipelinePlan make_plan(Schedule schedule, int stages, int micro, int virtual_stages, int layers);
/// \brief The plan of a deck's parallel keys and model.
PipelinePlan make_plan(const ParallelConfig& parallel, const ModelConfig& model);

/// \brief A stretch of one stage's time under the unit-cost model.
struct Interval {
  enum Kind { forward, backward, idle } kind;
  int micro, chunk; ///< -1 for idle
  double start, length;
};

/// \brief The plan run with fixed costs and no communication latency.
struct Timeline {
  std::vector<std::vector<Interval>> stages; ///< per stage, in time order, idle gaps included
  double makespan = 0;
  std::vector<double> busy, idle; ///< per stage (idle = makespan - busy)
  std::vector<int>
      peak_in_flight; ///< per stage: most (micro, chunk) sets forwarded, not yet backwarded
  /// \brief Idle over busy time of `stage`: the bubble fraction.
  double bubble(int stage) const;
};

/// \brief Each stage runs its actions in order, an action starting when the stage is
/// free and its dependency has finished; a chunk of n layers costs n forward_cost
/// forward and n backward_cost backward. InternalError if the plan cannot finish.
Timeline simulate(const PipelinePlan& plan, double forward_cost = 1.0, double backward_cost = 2.0);

} // namespace cubelm::pipeline
