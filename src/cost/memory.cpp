#include "cubelm/cost/memory.hpp"

#include "cubelm/cost/activations.hpp"
#include "cubelm/cost/buckets.hpp"
#include "cubelm/io/checkpoint.hpp"

#include <algorithm>

namespace cubelm::cost {

StageLayout stage_layout(const pipeline::PipelinePlan& plan, int stage, bool recompute) {
  StageLayout s;
  s.chunks = plan.layers_of[static_cast<std::size_t>(stage)];
  s.first = plan.first(stage, 0);
  s.last = plan.last(stage, static_cast<int>(s.chunks.size()) - 1);
  s.slots = std::max(1, plan.slots[static_cast<std::size_t>(stage)]);
  s.recompute = recompute;
  return s;
}

Memory estimate_memory(const Deck& deck, int stage) {
  const pipeline::PipelinePlan plan = pipeline::make_plan(deck.parallel, deck.model);
  Memory most;
  for (int s = 0; s < plan.stages; ++s) {
    if (stage >= 0 && s != stage)
      continue;
    const Memory mem = stage_memory(deck, plan, s);
    if (mem.total() > most.total())
      most = mem;
  }
  return most;
}

Memory stage_memory(const Deck& deck, const pipeline::PipelinePlan& plan, int s) {
  const ParallelConfig& par = deck.parallel;
  const StageLayout layout = stage_layout(plan, s, par.recompute == Recompute::full);
  const StageShape shape = stage_shape(deck.model, layout, comm::layout_of(par));
  const std::int64_t params =
      parameters_per_rank(deck.model, par.tensor_mode, par.tensor_size, shape);
  Memory mem;
  // The master weights and, in a bf16 model, the bf16 copy its kernels read; gradients in
  // float.
  const int values = value_bytes(deck.train.precision);
  mem.parameters = (4 + (values < 4 ? values : 0)) * params;
  mem.gradients = 4 * params;
  // Under ZeRO-1 each bucket is padded to a multiple of its group's size (the dp x cp
  // replicas, or dp x cp x tp / ep for the experts') and this rank keeps the moments of its
  // piece of it, and the reduce-scattered gradient piece (groups of more than one rank).
  std::int64_t moments = params, pieces = 0;
  if (par.zero) {
    moments = 0;
    const BucketPlan buckets = stage_buckets(deck, plan, s).plan;
    for (std::size_t b = 0; b < buckets.size.size(); ++b) {
      const int replicas = par.data_size * par.context_size;
      const int group =
          buckets.expert[b] ? replicas / comm::layout_of(par).expert_replicas() : replicas;
      moments += buckets.size[b] / group;
      pieces += group > 1 ? buckets.size[b] / group : 0;
    }
  }
  mem.optimizer = 4 * (2 * moments + pieces);
  mem.activations =
      activation_bytes(deck.model, comm::layout_of(par), deck.micro_batch(), shape, values);
  // The values and both moments of the rank's parameters, under ZeRO its shard of the
  // moments (a replica writes none: this is the most a rank holds).
  if (deck.checkpoint.async)
    mem.checkpoint_buffers = 4 * (params + 2 * moments);
  // The first rank (stage 0) assembles the file's slabs when it writes alone.
  if (s == 0)
    mem.writer_slabs = static_cast<std::int64_t>(io::writer_buffer_bytes(
        checkpoint_shapes(deck.model), io::writers_named(deck.checkpoint.writers),
        comm::layout_of(par).world_size()));
  return mem;
}

std::vector<std::vector<std::uint64_t>> checkpoint_shapes(const ModelConfig& m) {
  std::vector<std::vector<std::uint64_t>> shapes;
  for (int part = 0; part < 3; ++part)
    for (const auto& [name, shape] : parameter_shapes(m))
      shapes.emplace_back(shape.begin(), shape.end());
  return shapes;
}

std::uint64_t checkpoint_bytes(const ModelConfig& m) {
  return io::checkpoint_file_bytes(checkpoint_shapes(m));
}

} // namespace cubelm::cost
