#pragma once
/// \file
/// \brief One optimizer step after another: data, micro-batches through the
/// pipeline stage, global-norm clipping, the learning-rate schedule and AdamW,
/// per-step metrics (docs/training.md).

#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/cost/step_sums.hpp"
#include "cubelm/io/sampler.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/pipeline/schedule.hpp"
#include "cubelm/train/background_save.hpp"
#include "cubelm/train/data_parallel.hpp"
#include "cubelm/train/metrics.hpp"
#include "cubelm/train/pipeline.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cubelm::train {

/// \brief Trains the deck's model on this rank's part of its layout.
class Trainer {
public:
  /// \brief The deck's layout over the ranks of `comm` (its size must fit the layout).
  explicit Trainer(const Deck& deck, const comm::Communicator& comm = comm::Communicator::world());
  ~Trainer();

  /// \brief Runs one optimizer step over the global batch of step `steps_done()`. A step
  /// whose loss or global gradient norm is not finite applies no AdamW update
  /// (StepMetrics::skipped) but still counts; after train.max_bad_steps consecutive
  /// skipped steps it throws a collective cubelm::Error (docs/reliability.md).
  StepMetrics step();
  /// \brief This rank's reasons to stop after the next step(); that step's world
  /// reduction sums them over the ranks into StepMetrics::stop, so every rank learns
  /// of a request made on any one (docs/reliability.md#walltime-and-signals).
  void vote_stop(const StopVotes& vote) { vote_ = vote; }
  /// \brief Collective: the mean loss per token of the validation batches
  /// (validation_batches() global batches of the held-out tokens, the same ones every
  /// time), computed under this run's layout by forward passes and the head's loss
  /// (PipelineStage::evaluate); parameters, moments and the next step are untouched. std::nullopt
  /// when the deck names no validation tokens (docs/training.md#validation).
  std::optional<double> validate();
  /// \brief Validation global batches per validate(); 0 without validation tokens.
  int validation_batches() const { return split_.batches; }
  /// \brief The training and validation token counts (io::split_tokens).
  const io::TokenSplit& tokens() const { return split_; }
  /// \brief Steps done so far (the next step's number), skipped ones included.
  int steps_done() const { return step_; }
  /// \brief AdamW updates applied so far (steps_done() less the skipped steps); the
  /// bias correction of the next update uses updates_done() + 1.
  int updates_done() const { return updates_; }
  /// \brief Skipped steps since the last step that updated the model.
  int bad_steps() const { return bad_; }
  /// \brief The model of an fp32 or tf32 run (an InternalError under bf16, whose model
  /// stores bfloat16: read its parameters through params()).
  model::ShardedGPT<real>& model();
  /// \brief True when the model stores bfloat16 (train.precision = "bf16").
  bool bf16_storage() const { return net16_ != nullptr; }
  /// \brief This rank's parameters as the optimizer and checkpoints see them (master
  /// weights and gradients, float), in the model's order, whatever the model stores.
  std::vector<const tp::ParamBlock<real>*> params() const;
  /// \brief The entropy floor of the synthetic corpus (nats/token), or a negative number.
  double entropy_floor() const { return floor_; }
  /// \brief Writes model, moments and attributes after steps_done() steps.
  void save(const std::string& path) const;
  /// \brief True when checkpoints are written in the background: checkpoint.async, with an
  /// MPI that lets a second thread communicate (comm::second_thread_problem; else
  /// async_note() says why they are not).
  bool saves_in_background() const { return saves_ != nullptr; }
  /// \brief Why checkpoint.async = true writes synchronously after all, or "".
  const std::string& async_note() const { return async_note_; }
  /// \brief Collective: copies the state after steps_done() steps into host buffers and
  /// starts writing `path` from them in the background; training may go on at once. The
  /// write in flight must have been finished first (finish_background_save). Rank 0 runs
  /// `after_commit` on the writer thread once the file is committed (files only).
  void save_in_background(const std::string& path, std::function<void()> after_commit);
  /// \brief Collective: waits for the background write in flight, if any, and returns what
  /// became of it, the same on every rank (a write that failed on any rank failed).
  std::optional<BackgroundResult> finish_background_save();
  /// \brief Continues from a checkpoint: parameters, moments and the step counter. A
  /// checkpoint of another run (train::run_identity) is a train::OtherRunCheckpoint
  /// unless the deck sets checkpoint.allow_other_run; then resume_note() says what differs.
  void resume(const std::string& path);
  /// \brief What the last resume loaded despite differences, or "".
  const std::string& resume_note() const { return resume_note_; }
  /// \brief Before training from step 0: refuses (train::OtherRunCheckpoint) when
  /// checkpoint.dir holds another run's checkpoints; returns how many of an earlier run of
  /// the same identity it holds (train::check_checkpoint_dir).
  int check_checkpoint_dir() const;
  /// \brief Continues from the newest checkpoint of `dir` that loads: a damaged one
  /// (checksum, truncation, wrong shapes) is passed to `skipped` with the reason and the
  /// next older one is tried. Returns the file loaded, or "" when `dir` holds none; an
  /// Error when none of them loads (no silent restart from step 0).
  std::string resume_newest(
      const std::string& dir,
      const std::function<void(const std::string& file, const std::string& why)>& skipped);
  /// \brief This rank's memory: parameters, gradients, AdamW moments, activation buffers.
  cost::Memory memory() const;
  /// \brief Everything this rank sent so far, per group and collective kind: the steps'
  /// (validation's is not counted in them).
  std::vector<comm::TrafficEntry> traffic() const;
  /// \brief True on the rank that prints (world rank 0).
  bool is_root() const { return grid().coords().world == 0; }
  /// \brief Sets the per-rank peak used for MFU: the node's rate alone, measured
  /// with `threads` host threads, times this rank's `share` of the node
  /// (core/peak.hpp); the metrics carry all three.
  void set_peak_gflops(double peak, double share = 1, int threads = 1) {
    peak_gflops_ = peak;
    peak_share_ = share;
    peak_threads_ = threads;
  }
  /// \brief The pipeline schedule of every stage and its unit-cost timeline.
  const pipeline::PipelinePlan& plan() const { return plan_; }
  const pipeline::Timeline& timeline() const { return timeline_; }
  const comm::ProcessGrid& grid() const { return net16_ ? *net16_->grid : *net_->grid; }
  /// \brief This rank's pipeline stage (its input buffer pool).
  const PipelineStage& stage() const { return stage_; }
  DataParallel& data_parallel() { return *dp_; }

private:
  Deck deck_;
  comm::Communicator comm_;
  comm::Watchdog watchdog_; // parallel.timeout_s, from the first collective to the last
  std::vector<std::int32_t> tokens_;
  std::unique_ptr<io::Sampler> sampler_;
  io::TokenSplit split_;
  std::vector<std::int32_t> val_tokens_; // held out: validate() reads them
  std::unique_ptr<io::Sampler> val_sampler_;
  std::vector<comm::TrafficEntry> val_traffic_; // what validate() sent, left out of traffic()
  pipeline::PipelinePlan plan_;
  pipeline::Timeline timeline_;
  PipelineStage stage_;
  // The model: float storage, or bfloat16 under train.precision = "bf16"; one of the two.
  std::unique_ptr<model::GridModel<real>> net_;
  std::unique_ptr<model::GridModel<bf16>> net16_;
  // f(model) on whichever model this run has.
  template <class F>
  decltype(auto) with_model(F&& f) {
    if (net16_)
      return f(*net16_->model);
    return f(*net_->model);
  }
  template <class F>
  decltype(auto) with_model(F&& f) const {
    if (net16_)
      return f(static_cast<const model::ShardedGPT<bf16>&>(*net16_->model));
    return f(static_cast<const model::ShardedGPT<real>&>(*net_->model));
  }
  std::unique_ptr<DataParallel> dp_;
  std::vector<io::Batch> batches_;
  // The step's sums over the world (cost::StepSums), packed for the reduction.
  Kokkos::View<double*, Kokkos::HostSpace> sums_{"cubelm::step_sums", cost::StepSums::kMost};
  StopVotes vote_;
  // The step's time split (ms, compute, idle, then each communication group's wait) of
  // this rank and of all ranks, exchanged over the grid's uncounted metrics group.
  TimeSplit split(double ms, const std::vector<std::pair<std::string, double>>& waits_before);
  std::vector<std::string> comm_groups_; // the grid's groups but pp, whose waits are idle
  Kokkos::View<double*, Kokkos::HostSpace> split_mine_, split_all_;
  int step_ = 0;
  std::string resume_note_;
  int updates_ = 0; // AdamW updates applied
  int bad_ = 0;     // consecutive skipped steps
  double floor_ = -1;
  double peak_gflops_ = 0;
  double peak_share_ = 1;
  int peak_threads_ = 1;
  std::string async_note_;
  // Last, so that it goes first: the write in flight ends before anything it reads.
  std::unique_ptr<BackgroundSaves> saves_;
};

} // namespace cubelm::train
