#pragma once
/// \file
/// \brief How a stage's gradients are cut into the buckets that data parallelism
/// reduces (docs/training.md): the one rule, used by train::DataParallel for the
/// real buffers and by the closed-form traffic (cost/traffic.hpp). No Kokkos.

#include "cubelm/core/config.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/pipeline/schedule.hpp"

#include <cstdint>
#include <vector>

namespace cubelm::cost {

/// \brief Where a parameter's gradient goes: the unit whose backward completes it, and
/// the order of the buckets (decreasing key: wte alone first, then the units in the
/// order backward completes them).
struct BucketUnit {
  int done = 0;       ///< the unit that completes the gradient (-1 lookup, l layer l, L ln_f/head)
  int key = 0;        ///< buckets in decreasing key
  bool alone = false; ///< in a bucket of its own (the tied wte)
};

/// \brief The unit of parameter `e` on a stage that holds the embedding lookup or not:
/// a stage without the lookup holds wte for the head, done with ln_f.
inline BucketUnit bucket_unit(const ParamEntry& e, const ModelConfig& m, bool lookup) {
  const int done = e.tied && !lookup ? m.layers : e.unit;
  return BucketUnit{done, e.tied ? m.layers + 1 : done, e.tied};
}

/// \brief One parameter, in bucket order (sorted by decreasing key, stable).
struct BucketItem {
  int key = 0;
  bool alone = false;
  std::int64_t size = 0; ///< elements on this rank
  bool expert = false;   ///< an MoE expert's tensor: reduced over the expert-data-parallel group
};

/// \brief Bucket order: decreasing key; inside a unit the experts' tensors after the others
/// (they are reduced over another group, so they start buckets of their own).
inline bool bucket_before(const BucketItem& a, const BucketItem& b) {
  return a.key != b.key ? a.key > b.key : !a.expert && b.expert;
}

/// \brief The buckets of `items` (in bucket_before order): a new bucket starts at the
/// first item, at an item alone or after one, where the items change between experts and
/// the rest, and where the key changes once the bucket holds `per_bucket` elements; each
/// bucket is padded to a multiple of `shards` (ZeRO-1: data_size), or of `expert_shards`
/// for the experts' buckets (ZeRO-1: data_size / expert_size).
struct BucketPlan {
  std::vector<std::int64_t> first, size; ///< [bucket]: offset and padded length
  std::vector<char> expert;              ///< [bucket]: holds experts' tensors
  std::vector<int> of;                   ///< [item]: its bucket
  std::vector<std::int64_t> offset;      ///< [item]: its offset in the flat buffer
};

inline BucketPlan plan_buckets(const std::vector<BucketItem>& items, std::int64_t per_bucket,
                               int shards, int expert_shards) {
  BucketPlan b;
  const auto pad = [&] {
    if (!b.size.empty()) {
      const std::int64_t n = b.expert.back() ? expert_shards : shards;
      b.size.back() = (b.size.back() + n - 1) / n * n;
    }
  };
  for (std::size_t k = 0; k < items.size(); ++k) {
    const bool new_unit = k == 0 || items[k - 1].key != items[k].key;
    const bool alone = items[k].alone || (k > 0 && items[k - 1].alone);
    const bool other_group = k > 0 && items[k - 1].expert != items[k].expert;
    if (b.size.empty() || alone || other_group || (new_unit && b.size.back() >= per_bucket)) {
      pad();
      b.first.push_back(b.size.empty() ? 0 : b.first.back() + b.size.back());
      b.size.push_back(0);
      b.expert.push_back(items[k].expert ? 1 : 0);
    }
    b.of.push_back(static_cast<int>(b.size.size()) - 1);
    b.offset.push_back(b.first.back() + b.size.back());
    b.size.back() += items[k].size;
  }
  pad();
  return b;
}

/// \brief The buckets of a rank of pipeline stage `stage` of `deck` (the stage's parameters
/// in this rank's tensor-parallel blocks, cut by parallel.bucket_mb, padded to a multiple of
/// data_size under ZeRO-1, the experts' of data_size / expert_size), as train::DataParallel
/// makes them, and per bucket the unit whose
/// backward completes it last (the lowest `done` of its parameters): its reduction can start
/// when that backward has run for the last micro-batch.
struct StageBuckets {
  BucketPlan plan;
  std::vector<int> done; ///< [bucket]
};
StageBuckets stage_buckets(const Deck& deck, int stage);
/// \brief The same with the deck's pipeline plan made already (pipeline::make_plan).
StageBuckets stage_buckets(const Deck& deck, const pipeline::PipelinePlan& plan, int stage);

} // namespace cubelm::cost
