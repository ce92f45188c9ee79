#pragma once
/// \file
/// \brief The model and AdamW state to and from the checkpoint schema of docs/training.md.
///
/// /model/<name> holds each parameter with its global shape, /optimizer/m/<name>
/// and /optimizer/v/<name> the AdamW moments; root attributes: format, version,
/// step (optimizer steps completed), tokens_seen, deck (full text), layout,
/// seed, data_cursor (the next step whose batch the sampler gives) and run (the
/// run's identity, run_identity below).

#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/model/sharded_gpt.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cubelm::train {

/// \brief A checkpoint of another run: its model, data or seed differ from the deck's
/// (docs/reliability.md#whose-checkpoint). Every rank raises it together; unlike a
/// damaged file, resume = "auto" does not step over it to an older one.
class OtherRunCheckpoint : public Error {
public:
  using Error::Error;
};

/// \brief One key of a run's identity and its value as text ("model.hidden", "768").
struct IdentityKey {
  std::string key, value;
};

/// \brief The keys that make a checkpoint this run's: the model (every key but
/// vocab_divisible_by, a layout choice), the data (format, path, sampler, the synthetic
/// corpus) and train.seed, train.global_batch and train.precision. What may change
/// between a run and its continuation is everything else: train.steps and the time
/// limit, the optimizer's keys (the learning-rate schedule among them), the layout
/// ([parallel]), [checkpoint] and [log].
std::vector<IdentityKey> run_identity(const Deck& deck);

/// \brief A key whose value differs between a checkpoint and the deck.
struct IdentityDifference {
  std::string key, stored, deck;
};

/// \brief The keys of `deck`'s identity whose values differ in the checkpoint `path`
/// (collective: every rank opens the file). A checkpoint written before the identity was
/// stored is compared through the deck text it holds. Errors (collective): the file
/// cannot be read, or neither its identity nor its deck can be.
std::vector<IdentityDifference> run_differences(const std::string& path, const Deck& deck,
                                                const comm::Communicator& comm);

/// \brief "train.seed = 1234 there, 99 in the deck; data.format = ..." for messages.
std::string describe_differences(const std::vector<IdentityDifference>& differences);

/// \brief Before a run writes checkpoints into `deck.checkpoint.dir` from step 0
/// (resume = "none"): an OtherRunCheckpoint when the directory holds a checkpoint of
/// another run, or one whose run cannot be read, which the run would write over or
/// leave for a later resume = "auto" to take. Returns how many checkpoints of an earlier
/// run of the same identity it holds (the run replaces them as it reaches their steps).
int check_checkpoint_dir(const Deck& deck, const comm::Communicator& comm);

/// \brief Version of the schema written into every checkpoint.
constexpr std::int64_t kCheckpointVersion = 1;

/// \brief "<dir>/step_00000012.h5" for the checkpoint taken after 12 steps.
std::string checkpoint_path(const std::string& dir, int step);
/// \brief The checkpoint of `dir` with the most steps, or "" when there is none.
std::string latest_checkpoint(const std::string& dir);
/// \brief The checkpoints of `dir` (step_XXXXXXXX.h5; never .partial files), newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& dir);
/// \brief After the checkpoint of step `committed` has been committed: removes all but
/// the newest `keep` checkpoints of `dir` up to that step (keep = 0: keep all).
/// Checkpoints of later steps (left by an earlier run, e.g. damaged ones that a
/// fallback passed over) are neither counted nor removed, so the newest checkpoint
/// that loaded is never pruned in their favour; the run overwrites them as it
/// reaches their steps. `committed` < 0 counts every checkpoint.
void prune_checkpoints(const std::string& dir, int keep, int committed = -1);

/// \brief The root and /optimizer attributes of a checkpoint after `step` steps.
struct CheckpointAttributes {
  std::int64_t step = 0;
  std::int64_t tokens_seen = 0;
  std::string deck;
  std::string layout;
  std::int64_t padded_vocab_size = 0;
  std::int64_t seed = 0;
  std::string run;
  std::int64_t optimizer_step = 0;
  /// `optimizer_step` < 0: `step`.
  static CheckpointAttributes of(const Deck& deck, int step, int optimizer_step);
};

struct MomentRun; // data_parallel.hpp

/// \brief One checkpoint copied to host buffers, to be written later by any thread (the
/// background saves of checkpoint.async). take() copies, on the thread that runs the
/// model, exactly what save_checkpoint would write: the blocks this rank writes (none
/// for a replica) and the attributes. write() then makes the same file as
/// save_checkpoint, with no Kokkos call. The buffer is kept for the next take().
class CheckpointSnapshot {
public:
  /// \brief What take() copied of one tensor: the block, of which this rank writes
  /// elements [first, first + count) (all of them but for a run of moments), at `offset`
  /// in the buffer.
  struct Tensor {
    std::string path;
    std::vector<std::uint64_t> shape;
    io::Block block;
    std::uint64_t first, count;
    std::int64_t offset;
  };

  template <class T>
  void take(const Deck& deck, const model::ShardedGPT<T>& model,
            const std::vector<kernels::Vec<real>>& m, const std::vector<kernels::Vec<real>>& v,
            int step, int optimizer_step);
  /// \brief As above, with the moments as runs (ZeRO's shards, DataParallel::moment_runs):
  /// this rank copies its own shard of them, and the file gathers them.
  template <class T>
  void take(const Deck& deck, const model::ShardedGPT<T>& model, const std::vector<MomentRun>& m,
            const std::vector<MomentRun>& v, int step, int optimizer_step);
  /// \brief Collective over `comm`: writes and commits the file `path`, as save_checkpoint.
  void write(const std::string& path, const comm::Communicator& comm) const;
  /// \brief Allocates the buffer for `bytes` (CheckpointSnapshot::bytes_for) and touches
  /// its pages, so that the first take() pays for neither.
  void reserve(std::int64_t bytes);
  /// \brief The host memory the buffer holds.
  std::int64_t bytes() const;
  /// \brief The host memory take() needs for `model` on this rank (given `runs`, the
  /// extents of its moments' runs, as the take() of runs).
  template <class T>
  static std::int64_t bytes_for(const model::ShardedGPT<T>& model,
                                const std::vector<MomentRun>* runs = nullptr);
  /// \brief The step taken.
  std::int64_t step() const { return attributes_.step; }

private:
  // Copies each tensor's values from its source into the buffer.
  void copy(const Deck& deck, std::vector<Tensor> tensors,
            const std::vector<const kernels::Vec<real>*>& sources, int step, int optimizer_step);
  std::vector<Tensor> tensors_;
  Kokkos::View<float*, Kokkos::HostSpace> buffer_;
  CheckpointAttributes attributes_;
  io::Writers writers_ = io::Writers::all;
};

/// \brief Collectively writes model (its master weights: float whatever it stores),
/// moments (zeros when `m`/`v` are null) and attributes. `optimizer_step` (the AdamW
/// updates applied, /optimizer attribute `step`) is `step` when negative; it is smaller
/// when steps were skipped (docs/reliability.md). T: float or bf16.
template <class T>
void save_checkpoint(const std::string& path, const Deck& deck, const model::ShardedGPT<T>& model,
                     const std::vector<kernels::Vec<real>>* m,
                     const std::vector<kernels::Vec<real>>* v, int step,
                     const comm::Communicator& comm, int optimizer_step = -1);

/// \brief As above, with the moments as runs of each parameter's block (ZeRO's shards,
/// DataParallel::moment_runs): every rank with ParamBlock::writes_moments writes its own
/// run, where it is, and the moments are gathered nowhere.
template <class T>
void save_checkpoint(const std::string& path, const Deck& deck, const model::ShardedGPT<T>& model,
                     const std::vector<MomentRun>* m, const std::vector<MomentRun>* v, int step,
                     const comm::Communicator& comm, int optimizer_step = -1);

/// \brief Collectively writes a step-0 checkpoint of `deck`'s model from whole tensors in
/// host memory, as `cubelm init` writes one: `values` maps every name of
/// cost::parameter_table (below /model) to its values, row-major with the stored shape
/// (wte: vocab_size rows); the AdamW moments are zeros and the attributes those of step 0.
/// The first rank of `comm` writes everything (the others may pass an empty map). A
/// missing name or a wrong count is a cubelm::InternalError. Used by `cubelm convert`.
void save_model_tensors(const std::string& path, const Deck& deck,
                        const std::map<std::string, std::vector<float>>& values,
                        const comm::Communicator& comm);

/// \brief Reads a checkpoint into the model's master weights (and a bf16 model's copy of
/// them) and the moments; every shape must match the deck (a message names the file, the
/// tensor and both shapes). Returns the step; `optimizer_step`, when given, receives the
/// /optimizer attribute `step`.
template <class T>
int load_checkpoint(const std::string& path, model::ShardedGPT<T>& model,
                    std::vector<kernels::Vec<real>>& m, std::vector<kernels::Vec<real>>& v,
                    const comm::Communicator& comm, int* optimizer_step = nullptr);
/// \brief Reads the weights of a checkpoint (/model only: generation needs no moments)
/// into the model, with the checks and messages of load_checkpoint.
template <class T>
void load_weights(const std::string& path, model::ShardedGPT<T>& model,
                  const comm::Communicator& comm);

} // namespace cubelm::train
