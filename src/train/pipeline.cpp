#include "cubelm/train/pipeline.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/model/shape.hpp"

#include <map>
#include <utility>

namespace cubelm::train {

namespace {

// The previous / next chunk of the model is on this same rank (one stage only).
bool local_prev(const PipelinePlan& plan, int chunk) {
  return plan.stages == 1 && chunk > 0;
}
bool local_next(const PipelinePlan& plan, int stage, int chunk) {
  return plan.stages == 1 &&
         chunk + 1 < static_cast<int>(plan.layers_of[static_cast<std::size_t>(stage)].size());
}

} // namespace

PipelineStage::PipelineStage(const PipelinePlan& plan, int stage) : plan_(plan), stage_(stage) {
  CUBELM_ASSERT(stage >= 0 && stage < plan.stages, "pipeline stage out of range");
  const auto& actions = plan.actions[static_cast<std::size_t>(stage)];
  const std::size_t n = actions.size();
  slot_.assign(n, -1);
  release_.assign(n, -1);
  release_local_.assign(n, -1);
  local_source_.assign(n, -1);
  // The plan's slot rule (Action::slot: lowest free at the forward, freed after the
  // backward) plus one the plan cannot know: with one stage, a chunk's input gradient
  // stays in its slot until the previous chunk's backward, on this rank, has read it.
  std::map<std::pair<int, int>, int> slot_of;
  std::vector<bool> busy;
  for (std::size_t i = 0; i < n; ++i) {
    const Action& a = actions[i];
    if (a.op == Op::forward) {
      int s = 0;
      while (s < static_cast<int>(busy.size()) && busy[static_cast<std::size_t>(s)])
        ++s;
      if (s == static_cast<int>(busy.size()))
        busy.push_back(false);
      busy[static_cast<std::size_t>(s)] = true;
      slot_of[{a.micro, a.chunk}] = s;
      slot_[i] = s;
      if (local_prev(plan, a.chunk))
        local_source_[i] = slot_of.at({a.micro, a.chunk - 1});
    } else {
      slot_[i] = slot_of.at({a.micro, a.chunk});
      // A same-rank next chunk left its input gradient in its slot for this backward.
      if (local_next(plan, stage, a.chunk)) {
        release_local_[i] = slot_of.at({a.micro, a.chunk + 1});
        busy[static_cast<std::size_t>(release_local_[i])] = false;
      }
      // This slot's input gradient is read by a same-rank previous chunk: keep it.
      if (!local_prev(plan, a.chunk)) {
        release_[i] = slot_[i];
        busy[static_cast<std::size_t>(slot_[i])] = false;
      }
    }
  }
  slots_ = static_cast<int>(busy.size());
}

model::StageLayout PipelineStage::layout(bool recompute) const {
  model::StageLayout s;
  s.chunks = plan_.layers_of[static_cast<std::size_t>(stage_)];
  s.first = plan_.first(stage_, 0);
  s.last = plan_.last(stage_, static_cast<int>(s.chunks.size()) - 1);
  s.slots = std::max(1, slots_);
  s.recompute = recompute;
  return s;
}

int PipelineStage::tag(bool backward, int micro, int chunk) const {
  // The sender's virtual stage identifies a message between a pair of stages.
  const int stages = plan_.stages * plan_.chunks;
  const int t = ((backward ? 1 : 0) * stages + chunk) * plan_.micro + micro;
  CUBELM_ASSERT(t < 32767, "pipeline message tags exceed the MPI guaranteed tag range");
  return t;
}

PipelineStage::Result PipelineStage::run(model::ShardedGPT<real>& model,
                                         const comm::ProcessGrid& grid,
                                         const std::vector<io::Batch>& batches, double grad_scale,
                                         const model::ShardedGPT<real>::UnitDone& done) {
  const ExecSpace exec;
  const comm::Group& pp = grid.pp();
  const int p = plan_.stages;
  const int prev = (stage_ + p - 1) % p, next = (stage_ + 1) % p;
  const auto& actions = plan_.actions[static_cast<std::size_t>(stage_)];
  // Per slot: the send of its output (received before the slot's backward, so
  // waiting for it never blocks for long) and of its input gradient (in flight until
  // the previous stage reaches that backward: never waited for, the slot gets a new
  // input buffer instead and the request keeps the old one until it completes).
  std::vector<comm::Request> forward(static_cast<std::size_t>(slots_));
  std::vector<comm::Request> backward(static_cast<std::size_t>(slots_));
  std::vector<comm::Request> retired;
  Result r;
  auto wait_for = [&](auto&& receive) {
    Kokkos::Timer timer;
    receive();
    r.wait_s += timer.seconds();
  };
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int s = slot_[i];
    const int vs = plan_.virtual_stage(stage_, a.chunk);
    const io::Batch& batch = batches.at(static_cast<std::size_t>(a.micro));
    comm::Request& fwd = forward[static_cast<std::size_t>(s)];
    comm::Request& bwd = backward[static_cast<std::size_t>(s)];
    if (a.op == Op::forward) {
      fwd.wait();
      if (!bwd.test()) {
        retired.push_back(std::move(bwd));
        model.detach_input(s);
      }
      if (!plan_.first(stage_, a.chunk)) {
        if (local_source_[i] >= 0)
          Kokkos::deep_copy(exec, model.input(s), model.output(a.chunk - 1, local_source_[i]));
        else
          wait_for(
              [&] { pp.irecv(exec, model.input(s), prev, tag(false, a.micro, vs - 1)).wait(); });
      }
      model.forward(a.chunk, s, batch.inputs);
      if (!plan_.last(stage_, a.chunk) && !local_next(plan_, stage_, a.chunk))
        fwd = pp.isend(exec, model.output(a.chunk, s), next, tag(false, a.micro, vs));
    } else {
      if (!plan_.last(stage_, a.chunk)) {
        if (release_local_[i] >= 0)
          Kokkos::deep_copy(exec, model.output_grad(), model.input_grad(release_local_[i]));
        else
          wait_for([&] {
            pp.irecv(exec, model.output_grad(), next, tag(true, a.micro, vs + 1)).wait();
          });
      }
      r.loss_sum += model.backward(a.chunk, s, batch.inputs, batch.targets, grad_scale,
                                   a.last_backward ? done : nullptr);
      if (!plan_.first(stage_, a.chunk) && !local_prev(plan_, a.chunk))
        bwd = pp.isend(exec, model.input_grad(s), prev, tag(true, a.micro, vs));
    }
  }
  wait_for([&] {
    comm::wait_all(forward);
    comm::wait_all(backward);
    comm::wait_all(retired);
  });
  exec.fence();
  return r;
}

model::Memory estimate_memory(const io::Deck& deck, int stage) {
  const io::ParallelConfig& par = deck.parallel;
  const PipelinePlan plan = make_plan(par.schedule, par.pipeline_size, par.microbatches,
                                      par.virtual_stages, deck.model.layers);
  model::Memory most;
  for (int s = 0; s < plan.stages; ++s) {
    if (stage >= 0 && s != stage)
      continue;
    const model::StageLayout layout = PipelineStage(plan, s).layout(par.recompute == "full");
    model::StageShape shape;
    for (const auto& chunk : layout.chunks)
      shape.layers += static_cast<int>(chunk.size());
    shape.longest = layout.longest();
    shape.slots = layout.slots;
    shape.recompute = layout.recompute;
    shape.first = layout.first;
    shape.last = layout.last;
    const std::int64_t params =
        model::parameters_per_rank(deck.model, par.tensor_mode, par.tensor_size, shape);
    model::Memory mem;
    mem.parameters = 4 * params;
    mem.gradients = mem.parameters;
    const std::int64_t shard = par.zero ? (params + par.data_size - 1) / par.data_size : params;
    mem.optimizer = 4 * (2 * shard + (par.zero && par.data_size > 1 ? shard : 0));
    mem.activations = 4 * model::activations_per_rank(deck.model, par.tensor_mode, par.tensor_size,
                                                      deck.micro_batch(), shape);
    if (mem.total() > most.total())
      most = mem;
  }
  return most;
}

} // namespace cubelm::train
