#pragma once
/// \file
/// \brief Runs one stage's part of a pipeline plan (pipeline/schedule.hpp): the
/// forward and backward passes of its chunks in the plan's order, with the
/// activations and their gradients sent between stages through `comm`.
///
/// Messages go in the plan's exchanges (pipeline/messages.hpp): before an action the
/// stage posts, as one comm::Batch, the sends that are due and the receive the
/// action needs, then waits for that receive only; sends are waited for when
/// their buffers are needed again. With NCCL a batch is one group call on the
/// pp group's communication stream, matched in posting order (no tags); the
/// exchanges are chosen so that this cannot deadlock, and MPI is given the same
/// order (one tag), so CPU runs check it. A chunk's output is sent from its slot
/// (kept until the chunk's backward, by which time the next stage has received
/// it); the gradient of its input from the same slot: a slot reused while that
/// send is still due or in flight gets a new input buffer, and the old one lives
/// until the send completes. When the previous chunk is on the same rank (one
/// stage holding several chunks) the activation is copied, and the slot whose
/// input gradient the previous chunk still has to read is kept until it has.

#include "cubelm/comm/grid.hpp"
#include "cubelm/io/sampler.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/pipeline/messages.hpp"
#include "cubelm/pipeline/schedule.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace cubelm::train {

class PipelineStage {
public:
  /// \brief Stage `stage` of `plan` (which must outlive it).
  PipelineStage(const pipeline::PipelinePlan& plan, int stage);

  /// \brief The part of the model this stage holds.
  cost::StageLayout layout(bool recompute) const;

  /// \brief What one step did on this stage.
  struct Result {
    double loss_sum = 0; ///< token losses of the micro-batches whose head ran here
    double wait_s = 0;   ///< wall-clock seconds spent waiting for other stages
  };
  /// \brief One step: every action of the stage, enqueued on `exec`. `batches[k]`: micro-batch k
  /// (its inputs on the first stage, its targets on the last); `done` is passed to the last
  /// backward of every chunk (gradients complete).
  /// The activations and their gradients travel as the model stores them (T: float, or
  /// bf16 under train.precision = "bf16").
  template <class T>
  Result run(const ExecSpace& exec, model::ShardedGPT<T>& model, const comm::ProcessGrid& grid,
             const std::vector<io::Batch>& batches, double grad_scale,
             const typename model::ShardedGPT<T>::UnitDone& done);

  /// \brief The loss of `batches` without gradients (validation): forward passes only, each
  /// micro-batch in turn through the virtual stages in order, every activation sent as soon
  /// as it is made and waited for, then the head's loss on the stage that holds it (the
  /// same kernels and collectives as a step's forward and loss). Uses slot 0 and the
  /// inputs' buffers; returns the token losses summed on this stage (0 without the head).
  template <class T>
  double evaluate(const ExecSpace& exec, model::ShardedGPT<T>& model, const comm::ProcessGrid& grid,
                  const std::vector<io::Batch>& batches);

  /// \brief For generation: the forward of one micro-batch (`inputs`, batch x seq_len ids)
  /// as evaluate() runs it, then the logits of the token marked in `marks`
  /// (ShardedGPT::logits) on the stage with the head, broadcast to the other stages: `out`
  /// (the real vocabulary) ends the same on every rank.
  template <class T>
  void logits(const ExecSpace& exec, model::ShardedGPT<T>& model, const comm::ProcessGrid& grid,
              const std::vector<std::int32_t>& inputs, const std::vector<std::int32_t>& marks,
              const kernels::Vec<float>& out);

  /// \brief True when messages go in posting order without tags (NCCL-capable; see
  /// pipeline::plan_exchanges), false when MPI matches them by tag.
  bool untagged() const { return untagged_; }

  /// \brief Input buffers the stage's pool holds (in flight or free): a slot whose input
  /// still backs a send of its gradient when the slot is reused takes a free one, or a new
  /// one that joins the pool, so steady-state steps allocate nothing; the pool grows to
  /// the most such sends ever in flight at once.
  int pooled_inputs() const {
    return static_cast<int>(spare_inputs_.size() + spare_inputs16_.size());
  }

private:
  // The forward of micro-batch `m` (`inputs`) through this stage's virtual stages in order,
  // each activation sent as soon as it is made and waited for; `head` runs after the
  // forward of the chunk with the head.
  template <class T>
  void forward_only(const ExecSpace& exec, model::ShardedGPT<T>& model,
                    const comm::ProcessGrid& grid, const std::vector<std::int32_t>& inputs, int m,
                    const std::function<void()>& head);
  int tag(const pipeline::Message& m) const;
  int tag(bool backward, int sender, int micro) const;
  // Gives `slot` another input buffer from the pool while a send still holds its current one.
  template <class T>
  void detach_input(model::ShardedGPT<T>& model, int slot);
  std::vector<kernels::Mat<real>>& spares(real) { return spare_inputs_; }
  std::vector<kernels::Mat<bf16>>& spares(bf16) { return spare_inputs16_; }

  const pipeline::PipelinePlan& plan_;
  int stage_;
  std::vector<pipeline::Exchange> exchanges_; // this stage's, in posting order
  bool untagged_ = false;
  std::vector<kernels::Mat<real>> spare_inputs_;   // detach_input's pool
  std::vector<kernels::Mat<bf16>> spare_inputs16_; // the same for a bf16 model
};

} // namespace cubelm::train
