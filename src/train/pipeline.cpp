#include "cubelm/train/pipeline.hpp"

#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/model/memory.hpp"

#include <algorithm>

namespace cubelm::train {

PipelineStage::PipelineStage(const plan::PipelinePlan& plan, int stage)
    : plan_(plan), stage_(stage) {
  CUBELM_ASSERT(stage >= 0 && stage < plan.stages, "pipeline stage out of range");
}

model::StageLayout PipelineStage::layout(bool recompute) const {
  return model::stage_layout(plan_, stage_, recompute);
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
  const int slots = plan_.slots[static_cast<std::size_t>(stage_)];
  const auto& actions = plan_.actions[static_cast<std::size_t>(stage_)];
  // Per slot: the send of its output (received before the slot's backward, so
  // waiting for it never blocks for long) and of its input gradient (in flight until
  // the previous stage reaches that backward: never waited for, the slot gets a new
  // input buffer instead and the request keeps the old one until it completes).
  std::vector<comm::Request> forward(static_cast<std::size_t>(slots));
  std::vector<comm::Request> backward(static_cast<std::size_t>(slots));
  std::vector<comm::Request> retired;
  Result r;
  auto wait_for = [&](auto&& receive) {
    Kokkos::Timer timer;
    receive();
    r.wait_s += timer.seconds();
  };
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const plan::Action& a = actions[i];
    const int s = a.slot;
    const int vs = plan_.virtual_stage(stage_, a.chunk);
    const io::Batch& batch = batches.at(static_cast<std::size_t>(a.micro));
    comm::watchdog::set_micro_batch(a.micro);
    comm::Request& fwd = forward[static_cast<std::size_t>(s)];
    comm::Request& bwd = backward[static_cast<std::size_t>(s)];
    if (a.op == plan::Op::forward) {
      fwd.wait();
      if (!bwd.test()) {
        // Completed sends give their buffers back to the model's pool first.
        retired.erase(std::remove_if(retired.begin(), retired.end(),
                                     [](comm::Request& q) { return q.test(); }),
                      retired.end());
        retired.push_back(std::move(bwd));
        model.detach_input(s);
      }
      if (!plan_.first(stage_, a.chunk)) {
        if (a.input_from >= 0)
          Kokkos::deep_copy(exec, model.input(s), model.output(a.chunk - 1, a.input_from));
        else
          wait_for(
              [&] { pp.irecv(exec, model.input(s), prev, tag(false, a.micro, vs - 1)).wait(); });
      }
      model.forward(a.chunk, s, batch.inputs);
      if (!plan_.last(stage_, a.chunk) && !plan_.local_next(stage_, a.chunk))
        fwd = pp.isend(exec, model.output(a.chunk, s), next, tag(false, a.micro, vs));
    } else {
      if (!plan_.last(stage_, a.chunk)) {
        if (a.grad_from >= 0)
          Kokkos::deep_copy(exec, model.output_grad(), model.input_grad(a.grad_from));
        else
          wait_for([&] {
            pp.irecv(exec, model.output_grad(), next, tag(true, a.micro, vs + 1)).wait();
          });
      }
      r.loss_sum += model.backward(a.chunk, s, batch.inputs, batch.targets, grad_scale,
                                   a.last_backward ? done : nullptr);
      if (!plan_.first(stage_, a.chunk) && !plan_.local_prev(a.chunk))
        bwd = pp.isend(exec, model.input_grad(s), prev, tag(true, a.micro, vs));
    }
  }
  comm::watchdog::set_micro_batch(-1);
  wait_for([&] {
    comm::wait_all(forward);
    comm::wait_all(backward);
    comm::wait_all(retired);
  });
  exec.fence();
  return r;
}

} // namespace cubelm::train
