#include "cubelm/train/pipeline.hpp"

#include "cubelm/comm/batch.hpp"
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/model/memory.hpp"

#include <algorithm>
#include <utility>

namespace cubelm::train {

PipelineStage::PipelineStage(const plan::PipelinePlan& plan, int stage)
    : plan_(plan), stage_(stage) {
  CUBELM_ASSERT(stage >= 0 && stage < plan.stages, "pipeline stage out of range");
  plan::ExchangePlan exchanges = plan::plan_exchanges(plan);
  exchanges_ = std::move(exchanges.stages[static_cast<std::size_t>(stage)]);
  untagged_ = exchanges.untagged();
}

model::StageLayout PipelineStage::layout(bool recompute) const {
  return model::stage_layout(plan_, stage_, recompute);
}

int PipelineStage::tag(const plan::Message& m) const {
  if (untagged_)
    return 0; // matched in posting order (comm::Matching::in_order)
  // The sender's virtual stage identifies a message between a pair of stages.
  const int stages = plan_.stages * plan_.chunks;
  const int t = ((m.backward ? 1 : 0) * stages + m.sender) * plan_.micro + m.micro;
  CUBELM_ASSERT(t < comm::kInOrderTag, "pipeline message tags exceed the MPI guaranteed tag range");
  return t;
}

PipelineStage::Result PipelineStage::run(model::ShardedGPT<real>& model,
                                         const comm::ProcessGrid& grid,
                                         const std::vector<io::Batch>& batches, double grad_scale,
                                         const model::ShardedGPT<real>::UnitDone& done) {
  const ExecSpace exec;
  const comm::Group& pp = grid.pp();
  const comm::Matching matching = untagged_ ? comm::Matching::in_order : comm::Matching::by_tag;
  const int slots = plan_.slots[static_cast<std::size_t>(stage_)];
  const auto& actions = plan_.actions[static_cast<std::size_t>(stage_)];
  // Per slot: the send of its output (received before the slot's backward, so
  // waiting for it never blocks for long) and of its input gradient (in flight until
  // the previous stage reaches that backward: never waited for, the slot gets a new
  // input buffer instead and the request keeps the old one until it completes).
  std::vector<comm::Request> forward(static_cast<std::size_t>(slots));
  std::vector<comm::Request> backward(static_cast<std::size_t>(slots));
  std::vector<comm::Request> retired;
  // Sends whose action has run and whose exchange has not been posted yet.
  struct Due {
    plan::Message message;
    kernels::Mat<real> data; // holds the buffer, also once its slot has a new one
    int slot;
    bool detached; // the slot got a new input buffer since
  };
  std::vector<Due> due;
  std::size_t next = 0; // the next exchange of exchanges_
  Result r;
  auto wait_for = [&](auto&& receive) {
    Kokkos::Timer timer;
    receive();
    r.wait_s += timer.seconds();
  };
  // Posts the exchange before action `i`, if there is one: the sends due in it and
  // the receive of `want` into `into`. Returns the receive's Request.
  auto exchange = [&](std::size_t i, const plan::Message& want,
                      const kernels::Mat<real>* into) -> comm::Request {
    if (next == exchanges_.size() || exchanges_[next].before != i) {
      CUBELM_ASSERT(!want.exists(), "pipeline: no exchange receives " + want.describe());
      return {};
    }
    const plan::Exchange& e = exchanges_[next++];
    CUBELM_ASSERT(e.recv.exists() == want.exists() && (!want.exists() || e.recv.same(want)),
                  "pipeline: the exchange before action " + std::to_string(i) + " receives " +
                      e.recv.describe() + ", the action needs " + want.describe());
    comm::Batch batch(pp, matching);
    std::vector<Due> posted;
    for (const plan::Message& m : e.sends) {
      const auto it =
          std::find_if(due.begin(), due.end(), [&](const Due& d) { return d.message.same(m); });
      CUBELM_ASSERT(it != due.end(), "pipeline: " + m.describe() + " is sent before it is made");
      batch.send(it->data, m.to, tag(m));
      posted.push_back(std::move(*it));
      due.erase(it);
    }
    if (want.exists())
      batch.recv(*into, want.from, tag(want));
    std::vector<comm::Request> requests = batch.post(exec);
    for (std::size_t k = 0; k < posted.size(); ++k) {
      const Due& d = posted[k];
      const auto slot = static_cast<std::size_t>(d.slot);
      if (!d.message.backward)
        forward[slot] = std::move(requests[k]);
      else if (d.detached)
        retired.push_back(std::move(requests[k]));
      else
        backward[slot] = std::move(requests[k]);
    }
    return want.exists() ? std::move(requests.back()) : comm::Request();
  };
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const plan::Action& a = actions[i];
    const int s = a.slot;
    const io::Batch& batch = batches.at(static_cast<std::size_t>(a.micro));
    comm::watchdog::set_micro_batch(a.micro);
    comm::Request& fwd = forward[static_cast<std::size_t>(s)];
    comm::Request& bwd = backward[static_cast<std::size_t>(s)];
    const plan::Message want = plan::receive_before(plan_, stage_, i);
    if (a.op == plan::Op::forward) {
      for (const Due& d : due)
        CUBELM_ASSERT(d.message.backward || d.slot != s,
                      "pipeline: slot " + std::to_string(s) + " reused before its output is sent");
      fwd.wait();
      // The slot's input holds the gradient its last backward sends, unless that send
      // is complete: then the slot takes another buffer.
      bool sending = !bwd.test();
      for (const Due& d : due)
        sending = sending || (d.message.backward && d.slot == s && !d.detached);
      if (sending) {
        // Completed sends give their buffers back to the model's pool first.
        retired.erase(std::remove_if(retired.begin(), retired.end(),
                                     [](comm::Request& q) { return q.test(); }),
                      retired.end());
        retired.push_back(std::move(bwd));
        model.detach_input(s);
        for (Due& d : due)
          d.detached = d.detached || (d.message.backward && d.slot == s);
      }
      if (!plan_.first(stage_, a.chunk) && a.input_from >= 0)
        Kokkos::deep_copy(exec, model.input(s), model.output(a.chunk - 1, a.input_from));
      comm::Request in = exchange(i, want, &model.input(s));
      wait_for([&] { in.wait(); });
      model.forward(a.chunk, s, batch.inputs);
    } else {
      if (!plan_.last(stage_, a.chunk) && a.grad_from >= 0)
        Kokkos::deep_copy(exec, model.output_grad(), model.input_grad(a.grad_from));
      comm::Request in = exchange(i, want, &model.output_grad());
      wait_for([&] { in.wait(); });
      r.loss_sum += model.backward(a.chunk, s, batch.inputs, batch.targets, grad_scale,
                                   a.last_backward ? done : nullptr);
    }
    const plan::Message made = plan::send_after(plan_, stage_, i);
    if (made.exists())
      due.push_back({made,
                     a.op == plan::Op::forward ? model.output(a.chunk, s) : model.input_grad(s), s,
                     false});
  }
  comm::Request none = exchange(actions.size(), plan::Message(), nullptr);
  CUBELM_ASSERT(due.empty() && next == exchanges_.size(),
                "pipeline: the step ends with sends that were never posted");
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
