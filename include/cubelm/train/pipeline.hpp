#pragma once
/// \file
/// \brief Runs one stage's part of a pipeline plan (train/schedule.hpp): the
/// forward and backward passes of its chunks in the plan's order, with the
/// activations and their gradients sent between stages through `comm`.
///
/// Sends are non-blocking and a receive is waited for at once (both go through the
/// non-blocking calls, which take the same route for device memory), so a stage
/// waits only for what it needs next; a plan the unit-cost simulation runs to the end cannot
/// deadlock. A chunk's output is sent from its slot (kept until the chunk's
/// backward, by which time the next stage has received it); the gradient of its
/// input from the same slot, waited for before the slot is used again. When the
/// previous chunk is on the same rank (one stage holding several chunks) the
/// activation is copied, and the slot whose input gradient the previous chunk
/// still has to read is kept until it has.

#include "cubelm/comm/grid.hpp"
#include "cubelm/io/sampler.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/train/schedule.hpp"

#include <vector>

namespace cubelm::train {

class PipelineStage {
public:
  /// \brief Stage `stage` of `plan`.
  PipelineStage(const PipelinePlan& plan, int stage);

  /// \brief Activation slots this stage needs (ShardedGPT's StageLayout::slots).
  int slots() const { return slots_; }
  /// \brief The part of the model this stage holds.
  model::StageLayout layout(bool recompute) const;

  /// \brief What one step did on this stage.
  struct Result {
    double loss_sum = 0; ///< token losses of the micro-batches whose head ran here
    double wait_s = 0;   ///< wall-clock seconds spent waiting for other stages
  };
  /// \brief One step: every action of the stage. `batches[k]`: micro-batch k (its
  /// inputs on the first stage, its targets on the last); `done` is passed to the
  /// last backward of every chunk (gradients complete).
  Result run(model::ShardedGPT<real>& model, const comm::ProcessGrid& grid,
             const std::vector<io::Batch>& batches, double grad_scale,
             const model::ShardedGPT<real>::UnitDone& done);

private:
  int tag(bool backward, int micro, int chunk) const;

  const PipelinePlan& plan_;
  int stage_;
  std::vector<int> slot_;          // per action: its activation slot
  std::vector<int> release_;       // per action: a slot freed after it, or -1
  std::vector<int> release_local_; // per action: the consumed local slot freed after it, or -1
  std::vector<int> local_source_;  // per forward action: slot of the same-rank producer, or -1
  int slots_ = 0;
};

/// \brief Memory per rank of a deck's layout (float32) on its fullest pipeline stage:
/// the stage's parameters and gradients, AdamW's moments (under ZeRO-1 a 1/dp shard and
/// the reduce-scattered gradient piece, exact up to the padding of each gradient bucket to
/// a multiple of dp) and the activations of the slots its schedule holds. `stage` >= 0:
/// that stage's ranks instead.
model::Memory estimate_memory(const io::Deck& deck, int stage = -1);

} // namespace cubelm::train
