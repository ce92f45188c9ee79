#include "cubelm/train/data_parallel.hpp"

#include "cubelm/comm/batch.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/buckets.hpp"
#include "cubelm/cost/shape.hpp"

#include <algorithm>
#include <map>
#include <string>

namespace cubelm::train {

using kernels::Vec;

struct DataParallel::Bucket {
  const comm::Group* group = nullptr; // dp, or expert_dp for the experts' tensors
  int shards = 1, rank = 0;           // ZeRO-1: the group's size and this rank's index
  std::int64_t first = 0, size = 0;   // elements of values_/grads_, padded to a multiple of shards
  std::int64_t moment_first = 0;      // this rank's piece in m_/v_
  std::vector<int> units;             // distinct units whose gradients it holds
  int remaining = 0;                  // units not yet complete this step
  bool started = false;
  Vec<real> piece; // ZeRO: the reduce-scattered gradient piece, then values
  comm::Request request;
};

struct DataParallel::Segment {
  std::int64_t first, n, moment_first;
  bool decay, counted;
};

template <class T>
DataParallel::DataParallel(model::ShardedGPT<T>& model, const comm::ProcessGrid& grid,
                           double bucket_bytes, bool zero)
    : grid_(grid), zero_(zero),
      refresh_([&model](const ExecSpace& exec) { model.refresh_weights(exec); }) {
  for (auto& p : model.params())
    params_.push_back(&p);
  build(model.config(), model.stage().first, bucket_bytes);
}

template DataParallel::DataParallel(model::ShardedGPT<real>&, const comm::ProcessGrid&, double,
                                    bool);
template DataParallel::DataParallel(model::ShardedGPT<bf16>&, const comm::ProcessGrid&, double,
                                    bool);

void DataParallel::build(const ModelConfig& config, bool lookup, double bucket_bytes) {
  const comm::ProcessGrid& grid = grid_;
  const bool zero = zero_;
  const Blocks& params = params_;
  // Order: wte alone first, then units in the order backward completes them.
  std::map<std::string, cost::BucketUnit> units;
  for (const cost::ParamEntry& e : cost::parameter_table(config))
    units[e.name] = cost::bucket_unit(e, config, lookup);
  auto unit = [&](std::size_t i) -> const cost::BucketUnit& {
    const auto u = units.find(params[i]->name);
    CUBELM_ASSERT(u != units.end(), "parameter '" + params[i]->name + "' belongs to no unit");
    return u->second;
  };
  std::vector<std::size_t> order(params.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  const auto item = [&](std::size_t i) {
    return cost::BucketItem{unit(i).key, unit(i).alone, params[i]->size(), params[i]->expert};
  };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return cost::bucket_before(item(a), item(b));
  });
  std::vector<cost::BucketItem> items;
  for (const std::size_t i : order)
    items.push_back(item(i));
  const cost::BucketPlan plan = cost::plan_buckets(
      items, std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_bytes / sizeof(real))),
      zero ? grid.dp().size() : 1, zero ? grid.expert_dp().size() : 1);
  offset_.assign(params.size(), 0);
  buckets_.resize(plan.size.size());
  std::vector<std::vector<std::size_t>> members(plan.size.size());
  for (std::size_t b = 0; b < plan.size.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.first = plan.first[b];
    bucket.size = plan.size[b];
    bucket.group = plan.expert[b] ? &grid.expert_dp() : &grid.dp();
    bucket.shards = zero ? bucket.group->size() : 1;
    bucket.rank = zero ? bucket.group->rank() : 0;
  }
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    Bucket& b = buckets_[static_cast<std::size_t>(plan.of[k])];
    offset_[i] = plan.offset[k];
    const int u = unit(i).done;
    if (std::find(b.units.begin(), b.units.end(), u) == b.units.end())
      b.units.push_back(u);
    members[static_cast<std::size_t>(plan.of[k])].push_back(i);
  }
  const std::int64_t total = plan.size.empty() ? 0 : plan.first.back() + plan.size.back();
  // Move the parameters into the flat buffers.
  values_ = Vec<real>("cubelm::values", total);
  grads_ = Vec<real>("cubelm::grads", total);
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto& p = *params[i];
    const auto r = std::make_pair(offset_[i], offset_[i] + p.size());
    Kokkos::deep_copy(Kokkos::subview(values_, r), p.value);
    Kokkos::deep_copy(Kokkos::subview(grads_, r), p.grad);
    p.value = Kokkos::subview(values_, r);
    p.grad = Kokkos::subview(grads_, r);
  }
  // This rank's piece of every bucket, and the parameters' parts in it. Without ZeRO
  // every replica holds the whole bucket: the first of the group counts it in the norm.
  std::int64_t moments = 0;
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    const std::int64_t piece = b.size / b.shards;
    const std::int64_t lo = b.first + b.rank * piece, hi = lo + piece;
    const bool counts = zero || b.group->rank() == 0;
    b.moment_first = moments;
    if (zero && b.shards > 1)
      b.piece = Vec<real>("cubelm::grad_piece", piece);
    for (const std::size_t i : members[bi]) {
      const std::int64_t a = std::max(lo, offset_[i]);
      const std::int64_t e = std::min(hi, offset_[i] + params[i]->size());
      if (a < e)
        segments_.push_back(
            {a, e - a, moments + (a - lo), params[i]->decay, params[i]->counted && counts});
    }
    moments += piece;
  }
  counts_any_ = std::any_of(segments_.begin(), segments_.end(),
                            [](const Segment& seg) { return seg.counted; });
  m_ = Vec<real>("cubelm::adam_m", moments);
  v_ = Vec<real>("cubelm::adam_v", moments);
  // The segments as the optimizer's chunk table, on the device.
  std::vector<kernels::OptimChunk> chunks;
  for (const auto& seg : segments_)
    for (std::int64_t at = 0; at < seg.n; at += kernels::kOptimChunk)
      chunks.push_back({seg.first + at, seg.moment_first + at,
                        std::min(kernels::kOptimChunk, seg.n - at), seg.decay, seg.counted});
  Kokkos::View<kernels::OptimChunk*, MemSpace> table("cubelm::optim_chunks", chunks.size());
  const Kokkos::View<const kernels::OptimChunk*, Kokkos::HostSpace,
                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      host(chunks.data(), chunks.size());
  Kokkos::deep_copy(table, host);
  chunks_ = table;
}

DataParallel::~DataParallel() {
  for (auto& b : buckets_)
    b.request.wait();
}

int DataParallel::buckets() const {
  return static_cast<int>(buckets_.size());
}

std::int64_t DataParallel::bucket_elements(int b) const {
  return buckets_.at(static_cast<std::size_t>(b)).size;
}

std::int64_t DataParallel::optimizer_bytes() const {
  std::int64_t n = 2 * m_.extent_int(0);
  for (const auto& b : buckets_)
    n += b.piece.extent_int(0);
  return n * static_cast<std::int64_t>(sizeof(real));
}

Vec<real> DataParallel::range(const Vec<real>& all, std::int64_t first, std::int64_t n) const {
  return Kokkos::subview(all, std::make_pair(first, first + n));
}

void DataParallel::start_step() {
  for (auto& b : buckets_) {
    b.request.wait();
    b.started = false;
    b.remaining = static_cast<int>(b.units.size());
  }
}

void DataParallel::launch(Bucket& b) {
  b.started = true;
  const comm::Group& dp = *b.group;
  if (dp.size() == 1)
    return;
  const ExecSpace exec;
  const Vec<real> grads = range(grads_, b.first, b.size);
  if (zero_)
    b.request = dp.ireduce_scatter(exec, grads, b.piece);
  else
    b.request = dp.iall_reduce(exec, grads);
}

void DataParallel::unit_done(int unit) {
  for (auto& b : buckets_)
    if (!b.started && std::find(b.units.begin(), b.units.end(), unit) != b.units.end() &&
        --b.remaining == 0)
      launch(b);
}

void DataParallel::finish() {
  const ExecSpace exec;
  for (auto& b : buckets_)
    if (!b.started)
      launch(b);
  // The reductions are consumed on `exec`: with NCCL its stream waits for each
  // bucket's event (the host goes on); through MPI this waits on the host.
  for (auto& b : buckets_) {
    b.request.wait_on(exec);
    if (zero_ && b.shards > 1)
      Kokkos::deep_copy(
          exec, range(grads_, b.first + b.rank * (b.size / b.shards), b.size / b.shards), b.piece);
  }
  // The tied wte: the lookup's and the head's gradients, summed between the ends.
  const comm::Group& ends = grid_.embedding();
  if (ends.size() > 1 && !buckets_.empty()) {
    const Bucket& b = buckets_.front();
    const std::int64_t piece = b.size / b.shards;
    ends.all_reduce(exec, range(grads_, b.first + b.rank * piece, piece));
  }
}

void DataParallel::zero_grad() {
  Kokkos::deep_copy(ExecSpace(), grads_, real(0));
}

double DataParallel::sum_squares() const {
  // Replicas' elements are left out by the chunk table (each element once over the world);
  // a rank that counts none of its elements (a replica of a dense model) skips the kernel.
  if (!counts_any_)
    return 0.0;
  return kernels::sum_squares<real>(ExecSpace(), chunks_, grads_);
}

void DataParallel::update(const kernels::AdamW& hp, real clip) {
  const ExecSpace exec;
  kernels::adamw_update<real>(exec, hp, clip, chunks_, values_, grads_, m_, v_);
  if (zero_) {
    for (auto& b : buckets_)
      if (b.shards > 1) {
        const std::int64_t piece = b.size / b.shards;
        Kokkos::deep_copy(exec, b.piece, range(values_, b.first + b.rank * piece, piece));
        b.request = b.group->iall_gather(exec, b.piece, range(values_, b.first, b.size));
      }
    for (auto& b : buckets_)
      b.request.wait_on(exec);
  }
  refresh_(exec); // a bf16 model's weights follow the master weights
  exec.fence();   // a step ends with its update: its time includes the update's
}

std::size_t DataParallel::bucket_of(std::size_t i) const {
  std::size_t k = 0;
  while (k + 1 < buckets_.size() && offset_[i] >= buckets_[k].first + buckets_[k].size)
    ++k;
  return k;
}

std::vector<Vec<real>> DataParallel::moments(int which) const {
  const ExecSpace exec;
  const Vec<real>& mine = which == 0 ? m_ : v_;
  // The moments of every element of the stage, laid out as values_. Under ZeRO a bucket's
  // shards go to the first rank of its group alone, the replica that writes checkpoints
  // (Trainer): the others would gather a whole copy of the moments only to drop it.
  Vec<real> full = mine;
  std::vector<char> whole(buckets_.size(), 1);
  if (zero_) {
    bool any = false;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      whole[k] = buckets_[k].shards <= 1 || buckets_[k].group->rank() == 0;
      any = any || whole[k];
    }
    full =
        any ? Vec<real>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::moments_gathered"),
                        values_.extent(0))
            : Vec<real>();
    // Every bucket's transfers posted at once and waited for together: one after the other,
    // each receive waited for its sender to be scheduled (0.5 s of a 3 s save of GPT-2 124M
    // on 8 ranks sharing 2 cores).
    std::vector<comm::Request> gathering;
    for (const auto& b : buckets_) {
      const std::int64_t piece = b.size / b.shards;
      const Vec<real> own = range(mine, b.moment_first, piece);
      if (b.shards <= 1) {
        Kokkos::deep_copy(exec, range(full, b.first, b.size), own);
        continue;
      }
      comm::Batch batch(*b.group, comm::Matching::in_order);
      if (b.group->rank() == 0) {
        Kokkos::deep_copy(exec, range(full, b.first, piece), own);
        for (int r = 1; r < b.shards; ++r)
          batch.recv(range(full, b.first + r * piece, piece), r);
      } else {
        batch.send(own, 0);
      }
      for (comm::Request& request : batch.post(exec))
        gathering.push_back(std::move(request));
    }
    for (comm::Request& request : gathering)
      request.wait();
  }
  // Views into them, no copy: a checkpoint reads them at once (and a snapshot copies them
  // once, into its own buffers). A parameter whose bucket went to another rank: empty.
  std::vector<Vec<real>> out;
  const Blocks& params = params_;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::size_t k = bucket_of(i);
    out.push_back(buckets_.empty() || whole[k] ? range(full, offset_[i], params[i]->size())
                                               : Vec<real>());
  }
  exec.fence();
  return out;
}

std::vector<MomentRun> DataParallel::moment_runs(int which) const {
  const Vec<real>& mine = which == 0 ? m_ : v_;
  std::vector<MomentRun> out(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (buckets_.empty())
      continue;
    const Bucket& b = buckets_[bucket_of(i)];
    const std::int64_t piece = b.size / b.shards;
    const std::int64_t lo = b.first + b.rank * piece;
    const std::int64_t a = std::max(lo, offset_[i]);
    const std::int64_t e = std::min(lo + piece, offset_[i] + params_[i]->size());
    if (a < e)
      out[i] = {a - offset_[i], range(mine, b.moment_first + (a - lo), e - a)};
  }
  return out;
}

void DataParallel::set_moments(const std::vector<Vec<real>>& m, const std::vector<Vec<real>>& v) {
  const ExecSpace exec;
  const Blocks& params = params_;
  CUBELM_ASSERT(m.size() == params.size() && v.size() == params.size(),
                "set_moments needs one block per parameter");
  for (int which = 0; which < 2; ++which) {
    const auto& from = which == 0 ? m : v;
    Vec<real> full("cubelm::moments_whole", values_.extent(0));
    for (std::size_t i = 0; i < params.size(); ++i)
      Kokkos::deep_copy(exec, range(full, offset_[i], params[i]->size()), from[i]);
    const Vec<real>& mine = which == 0 ? m_ : v_;
    for (const auto& b : buckets_) {
      const std::int64_t piece = b.size / b.shards;
      Kokkos::deep_copy(exec, range(mine, b.moment_first, piece),
                        range(full, b.first + b.rank * piece, piece));
    }
  }
  exec.fence();
}

} // namespace cubelm::train
