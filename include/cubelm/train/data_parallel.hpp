#pragma once
/// \file
/// \brief Gradient buckets, their data-parallel reduction overlapped with the
/// backward pass, the tied-embedding sum between the pipeline's ends, and AdamW on
/// the optimizer state this rank owns (all of it, or its ZeRO-1 shard).
///
/// The parameters of a rank are moved into two flat buffers (values and
/// gradients) laid out in the order their gradients complete in backward: ln_f
/// and the head, the layers from the last to the first, the embedding. Buckets
/// are runs of whole units (a layer, ln_f, the embedding) of at least
/// `bucket_bytes`; the tied wte has a bucket of its own, at the start, so it lines
/// up between the first and the last pipeline stage. A bucket's reduction starts
/// (non-blocking) as soon as the backward pass has completed every unit in it.
/// Without ZeRO the buckets are all-reduced over dp and every rank updates every
/// element; with ZeRO-1 each bucket (padded to a multiple of dp) is
/// reduce-scattered, rank d updates piece d with its own moments, and the
/// updated values are all-gathered. MoE experts' tensors go into buckets of their own,
/// reduced (and sharded) over the expert-data-parallel group instead of dp.

#include "cubelm/comm/grid.hpp"
#include "cubelm/kernels/optim.hpp"
#include "cubelm/model/sharded_gpt.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace cubelm::train {

/// \brief A run of a parameter block's AdamW moments: its elements [first, first + n),
/// row-major, where n is values' extent (DataParallel::moment_runs).
struct MomentRun {
  std::int64_t first = 0;
  kernels::Vec<real> values;
};

class DataParallel {
public:
  /// \brief Takes over the storage of `model`'s master weights and gradients (they keep
  /// their values); `model` (float or bf16) must outlive it.
  template <class T>
  DataParallel(model::ShardedGPT<T>& model, const comm::ProcessGrid& grid, double bucket_bytes,
               bool zero);
  ~DataParallel();

  /// \brief Before the first backward of a step.
  void start_step();
  /// \brief The backward pass completed `unit` for the last time in this step
  /// (ShardedGPT::UnitDone); starts the reduction of the buckets it completes.
  void unit_done(int unit);
  /// \brief Starts what has not started (units this step never reported), orders the
  /// work on the default execution space after every reduction and sums wte over the
  /// pipeline's ends: work enqueued afterwards sees, on each rank, the summed gradient
  /// of every element it updates. With NCCL the execution space's stream waits for the
  /// reductions' events and the host does not; through MPI the host waits.
  void finish();

  /// \brief Zeroes every gradient of the stage (one fill of the flat buffer).
  void zero_grad();
  /// \brief Sum of squares of the gradient elements this rank accounts for in the global
  /// norm (each element of the model once over the world): one reduction.
  double sum_squares() const;
  /// \brief AdamW on this rank's elements (the whole stage, or its ZeRO shard) with the
  /// gradients scaled by `clip` (one kernel), then the all-gather of the updated shards
  /// and, in a bf16 model, the bf16 copy of the weights (ShardedGPT::refresh_weights).
  /// `hp.weight_decay` is applied to matrices only.
  void update(const kernels::AdamW& hp, real clip = 1);

  /// \brief AdamW moments m (which = 0) or v (which = 1) of every parameter of the stage,
  /// in params() order, whole blocks: views of the moments the optimizer updates, valid
  /// until the next update. Under ZeRO (collective over each bucket's group) the shards are
  /// gathered on the group's first rank, the replica that writes checkpoints, into a copy;
  /// the group's other ranks get empty views for those parameters and hold no copy.
  std::vector<kernels::Vec<real>> moments(int which) const;
  /// \brief This rank's own moments m (which = 0) or v (which = 1), per parameter in
  /// params() order, as runs of the parameter's block: elements [first, first + n) of the
  /// block, row-major, in views of the moments the optimizer updates (no copy, no
  /// communication), valid until the next update. Under ZeRO each rank of a bucket's group
  /// holds a run of some of its parameters (an empty view for the others); without, every
  /// block whole. A checkpoint's moments are written so, by every rank of a group.
  std::vector<MomentRun> moment_runs(int which) const;
  /// \brief Sets the moments from whole blocks (each rank keeps its shard).
  void set_moments(const std::vector<kernels::Vec<real>>& m,
                   const std::vector<kernels::Vec<real>>& v);

  /// \brief Bytes of the AdamW moments this rank holds (and, under ZeRO, the buffers of
  /// its reduce-scattered gradient pieces).
  std::int64_t optimizer_bytes() const;
  /// \brief Buckets and their sizes, for reports and tests.
  int buckets() const;
  std::int64_t bucket_elements(int b) const;
  bool zero() const { return zero_; }

private:
  struct Bucket;
  struct Segment; // the part of one parameter inside this rank's shard of a bucket
  void launch(Bucket& b);
  std::size_t bucket_of(std::size_t param) const; // the bucket that holds params()[param]
  kernels::Vec<real> range(const kernels::Vec<real>& all, std::int64_t first, std::int64_t n) const;

  using Blocks = std::vector<tp::ParamBlock<real>*>;
  // Orders the parameters into buckets and moves them into the flat buffers.
  void build(const ModelConfig& config, bool lookup, double bucket_bytes);

  Blocks params_; // the model's parameters, in its order
  const comm::ProcessGrid& grid_;
  bool zero_;
  std::function<void(const ExecSpace&)> refresh_; // ShardedGPT::refresh_weights
  bool counts_any_ = false; // some element of this rank counts in the gradient norm
  kernels::Vec<real> values_, grads_, m_, v_;
  std::vector<Bucket> buckets_;
  std::vector<Segment> segments_;
  kernels::OptimChunks chunks_;      // segments_ cut into pieces of at most kernels::kOptimChunk
  std::vector<std::int64_t> offset_; // per parameter: its first element in values_/grads_
};

} // namespace cubelm::train
