#pragma once
/// \file
/// \brief The model and AdamW state to and from the checkpoint schema of docs/training.md.
///
/// /model/<name> holds each parameter with its global shape, /optimizer/m/<name>
/// and /optimizer/v/<name> the AdamW moments; root attributes: format, version,
/// step (optimizer steps completed), tokens_seen, deck (full text), layout,
/// seed and data_cursor (the next step whose batch the sampler gives).

#include "cubelm/comm/communicator.hpp"
#include "cubelm/io/deck.hpp"
#include "cubelm/model/sharded_gpt.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::train {

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

/// \brief Collectively writes model, moments (zeros when `m`/`v` are null) and attributes.
/// `optimizer_step` (the AdamW updates applied, /optimizer attribute `step`) is `step`
/// when negative; it is smaller when steps were skipped (docs/reliability.md).
void save_checkpoint(const std::string& path, const Deck& deck,
                     const model::ShardedGPT<real>& model, const std::vector<kernels::Vec<real>>* m,
                     const std::vector<kernels::Vec<real>>* v, int step,
                     const comm::Communicator& comm, int optimizer_step = -1);

/// \brief Reads a checkpoint into the model and moments; every shape must match the
/// deck (a message names the file, the tensor and both shapes). Returns the step;
/// `optimizer_step`, when given, receives the /optimizer attribute `step`.
int load_checkpoint(const std::string& path, model::ShardedGPT<real>& model,
                    std::vector<kernels::Vec<real>>& m, std::vector<kernels::Vec<real>>& v,
                    const comm::Communicator& comm, int* optimizer_step = nullptr);

} // namespace cubelm::train
