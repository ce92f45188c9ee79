#pragma once
/// \file
/// \brief What a deck's layout puts on each rank: the stage layouts of its
/// pipeline plan and the bytes a rank holds (closed forms of cost/shape.hpp; no
/// allocation, so `cubelm check` prints them on a login node).

#include "cubelm/core/config.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/pipeline/schedule.hpp"

#include <cstdint>
#include <vector>

namespace cubelm::cost {

/// \brief The part of the model stage `stage` of `plan` holds: its chunks, whether it
/// has the lookup and the head, and the activation slots the plan gives it.
StageLayout stage_layout(const pipeline::PipelinePlan& plan, int stage, bool recompute);

/// \brief Memory per rank of a deck's layout (float32) on its fullest pipeline stage:
/// the stage's parameters and gradients, AdamW's moments (under ZeRO-1 a 1/dp shard and
/// the reduce-scattered gradient piece of every gradient bucket, each padded to a multiple
/// of dp as train::DataParallel pads it) and the activations of the slots its schedule holds.
/// `stage` >= 0: that stage's ranks instead.
Memory estimate_memory(const Deck& deck, int stage = -1);

/// \brief The memory of a rank of stage `stage`, with the deck's pipeline plan made already.
Memory stage_memory(const Deck& deck, const pipeline::PipelinePlan& plan, int stage);

/// \brief The shapes of the tensors of one checkpoint of model `m`, whatever the layout that
/// writes it: every parameter as stored (the vocabulary unpadded), then its two AdamW
/// moments (/model/, /optimizer/m/, /optimizer/v/: train::save_checkpoint).
std::vector<std::vector<std::uint64_t>> checkpoint_shapes(const ModelConfig& m);

/// \brief The bytes of that checkpoint's file: float32 data, checksums and HDF5's metadata
/// (io::checkpoint_file_bytes of checkpoint_shapes).
std::uint64_t checkpoint_bytes(const ModelConfig& m);

} // namespace cubelm::cost
