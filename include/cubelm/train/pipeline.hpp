#pragma once
/// \file
/// \brief Runs one stage's part of a pipeline plan (plan/schedule.hpp): the
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
#include "cubelm/plan/schedule.hpp"

#include <vector>

namespace cubelm::train {

class PipelineStage {
public:
  /// \brief Stage `stage` of `plan` (which must outlive it).
  PipelineStage(const plan::PipelinePlan& plan, int stage);

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

  const plan::PipelinePlan& plan_;
  int stage_;
};

} // namespace cubelm::train
