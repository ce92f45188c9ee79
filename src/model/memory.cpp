#include "cubelm/model/memory.hpp"

#include <algorithm>

namespace cubelm::model {

StageLayout stage_layout(const plan::PipelinePlan& plan, int stage, bool recompute) {
  StageLayout s;
  s.chunks = plan.layers_of[static_cast<std::size_t>(stage)];
  s.first = plan.first(stage, 0);
  s.last = plan.last(stage, static_cast<int>(s.chunks.size()) - 1);
  s.slots = std::max(1, plan.slots[static_cast<std::size_t>(stage)]);
  s.recompute = recompute;
  return s;
}

Memory estimate_memory(const Deck& deck, int stage) {
  const ParallelConfig& par = deck.parallel;
  const plan::PipelinePlan plan = plan::make_plan(par, deck.model);
  Memory most;
  for (int s = 0; s < plan.stages; ++s) {
    if (stage >= 0 && s != stage)
      continue;
    const StageLayout layout = stage_layout(plan, s, par.recompute == Recompute::full);
    StageShape shape;
    for (const auto& chunk : layout.chunks)
      shape.layers += static_cast<int>(chunk.size());
    shape.longest = layout.longest();
    shape.slots = layout.slots;
    shape.recompute = layout.recompute;
    shape.first = layout.first;
    shape.last = layout.last;
    const std::int64_t params =
        parameters_per_rank(deck.model, par.tensor_mode, par.tensor_size, shape);
    Memory mem;
    mem.parameters = 4 * params;
    mem.gradients = mem.parameters;
    const std::int64_t shard = par.zero ? (params + par.data_size - 1) / par.data_size : params;
    mem.optimizer = 4 * (2 * shard + (par.zero && par.data_size > 1 ? shard : 0));
    mem.activations = 4 * activations_per_rank(deck.model, par.tensor_mode, par.tensor_size,
                                               deck.micro_batch(), shape, par.sequence_parallel);
    if (mem.total() > most.total())
      most = mem;
  }
  return most;
}

} // namespace cubelm::model
