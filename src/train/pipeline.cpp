#include "cubelm/train/pipeline.hpp"

#include "cubelm/comm/batch.hpp"
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/memory.hpp"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

namespace cubelm::train {

PipelineStage::PipelineStage(const pipeline::PipelinePlan& plan, int stage)
    : plan_(plan), stage_(stage) {
  CUBELM_ASSERT(stage >= 0 && stage < plan.stages, "pipeline stage out of range");
  pipeline::ExchangePlan exchanges = pipeline::plan_exchanges(plan);
  exchanges_ = std::move(exchanges.stages[static_cast<std::size_t>(stage)]);
  untagged_ = exchanges.untagged();
}

cost::StageLayout PipelineStage::layout(bool recompute) const {
  return cost::stage_layout(plan_, stage_, recompute);
}

int PipelineStage::tag(const pipeline::Message& m) const {
  return tag(m.backward, m.sender, m.micro);
}

int PipelineStage::tag(bool backward, int sender, int micro) const {
  if (untagged_)
    return 0; // matched in posting order (comm::Matching::in_order)
  // The sender's virtual stage identifies a message between a pair of stages.
  const int stages = plan_.stages * plan_.chunks;
  const int t = ((backward ? 1 : 0) * stages + sender) * plan_.micro + micro;
  CUBELM_ASSERT(t < comm::kInOrderTag, "pipeline message tags exceed the MPI guaranteed tag range");
  return t;
}

namespace {

// The messages of one step on one stage. Before an action the stage posts the plan's next
// exchange, if it comes before that action: one comm::Batch of the sends that are due and
// the receive the action needs. The requests of the sends are kept per slot: the send of a
// slot's output (received before the slot's backward, so waiting for it never blocks for
// long) and of its input gradient (in flight until the previous stage reaches that
// backward: never waited for, the slot takes another input buffer instead and the request,
// retired, keeps the old one until it completes). Messages are the model's storage
// type: bfloat16 in a bf16 model.
template <class T>
class StepMessages {
public:
  using Mat = kernels::Mat<T>;

  StepMessages(const comm::Group& pp, comm::Matching matching,
               const std::vector<pipeline::Exchange>& exchanges, int slots,
               std::function<int(const pipeline::Message&)> tag)
      : pp_(pp), matching_(matching), exchanges_(exchanges), tag_(std::move(tag)),
        forward_(static_cast<std::size_t>(slots)), backward_(static_cast<std::size_t>(slots)) {}

  // An action made message `m` from `data`, a buffer of `slot`: it is due in a later
  // exchange, and `data` is held until then.
  void made(const pipeline::Message& m, const Mat& data, int slot) {
    due_.push_back({m, data, slot, false});
  }

  // Before the forward that reuses `slot`: waits for the send of the slot's output, and
  // returns true when the slot's input buffer still backs a send of its gradient, due or
  // in flight. That send's request is then retired (completed ones are dropped first, so
  // their buffers are free again): the slot must take another input buffer.
  bool input_busy(int slot) {
    const auto k = static_cast<std::size_t>(slot);
    for (const Due& d : due_)
      CUBELM_ASSERT(d.message.backward || d.slot != slot,
                    "pipeline: slot " + std::to_string(slot) + " reused before its output is sent");
    forward_[k].wait();
    bool busy = !backward_[k].test();
    for (const Due& d : due_)
      busy = busy || (d.message.backward && d.slot == slot && !d.detached);
    if (!busy)
      return false;
    retired_.erase(
        std::remove_if(retired_.begin(), retired_.end(), [](comm::Request& q) { return q.test(); }),
        retired_.end());
    retired_.push_back(std::move(backward_[k]));
    for (Due& d : due_)
      d.detached = d.detached || (d.message.backward && d.slot == slot);
    return true;
  }

  // Posts the exchange before action `i`, if there is one: the sends due in it and the
  // receive of `want` into `into`. Returns the receive's Request.
  comm::Request post(const ExecSpace& exec, std::size_t i, const pipeline::Message& want,
                     const Mat* into) {
    if (next_ == exchanges_.size() || exchanges_[next_].before != i) {
      CUBELM_ASSERT(!want.exists(), "pipeline: no exchange receives " + want.describe());
      return {};
    }
    const pipeline::Exchange& e = exchanges_[next_++];
    CUBELM_ASSERT(e.recv.exists() == want.exists() && (!want.exists() || e.recv.same(want)),
                  "pipeline: the exchange before action " + std::to_string(i) + " receives " +
                      e.recv.describe() + ", the action needs " + want.describe());
    comm::Batch batch(pp_, matching_);
    std::vector<Due> posted;
    for (const pipeline::Message& m : e.sends) {
      const auto it =
          std::find_if(due_.begin(), due_.end(), [&](const Due& d) { return d.message.same(m); });
      CUBELM_ASSERT(it != due_.end(), "pipeline: " + m.describe() + " is sent before it is made");
      batch.send(it->data, m.to, tag_(m));
      posted.push_back(std::move(*it));
      due_.erase(it);
    }
    if (want.exists())
      batch.recv(*into, want.from, tag_(want));
    std::vector<comm::Request> requests = batch.post(exec);
    for (std::size_t k = 0; k < posted.size(); ++k) {
      const Due& d = posted[k];
      const auto slot = static_cast<std::size_t>(d.slot);
      if (!d.message.backward)
        forward_[slot] = std::move(requests[k]);
      else if (d.detached)
        retired_.push_back(std::move(requests[k]));
      else
        backward_[slot] = std::move(requests[k]);
    }
    return want.exists() ? std::move(requests.back()) : comm::Request();
  }

  // After the last of `actions` actions: posts the exchange left (sends only).
  void post_last(const ExecSpace& exec, std::size_t actions) {
    post(exec, actions, pipeline::Message(), nullptr);
    CUBELM_ASSERT(due_.empty() && next_ == exchanges_.size(),
                  "pipeline: the step ends with sends that were never posted");
  }

  // Waits for every send of the step.
  void wait_all() {
    comm::wait_all(forward_);
    comm::wait_all(backward_);
    comm::wait_all(retired_);
  }

private:
  // A send whose action has run and whose exchange has not been posted yet.
  struct Due {
    pipeline::Message message;
    Mat data; // holds the buffer, also once its slot has a new one
    int slot;
    bool detached; // the slot got a new input buffer since
  };

  const comm::Group& pp_;
  comm::Matching matching_;
  const std::vector<pipeline::Exchange>& exchanges_;
  std::function<int(const pipeline::Message&)> tag_;
  std::size_t next_ = 0; // the next exchange of exchanges_
  std::vector<Due> due_;
  std::vector<comm::Request> forward_, backward_, retired_;
};

} // namespace

template <class T>
void PipelineStage::detach_input(model::ShardedGPT<T>& model, int slot) {
  auto& pool = spares(T());
  // A pooled buffer that only the pool holds is free: swap it in, the busy one out.
  for (kernels::Mat<T>& spare : pool)
    if (spare.use_count() == 1) {
      spare = model.replace_input(slot, spare);
      return;
    }
  pool.push_back(model.replace_input(slot, kernels::Mat<T>()));
}

template <class T>
PipelineStage::Result PipelineStage::run(const ExecSpace& exec, model::ShardedGPT<T>& model,
                                         const comm::ProcessGrid& grid,
                                         const std::vector<io::Batch>& batches, double grad_scale,
                                         const typename model::ShardedGPT<T>::UnitDone& done) {
  StepMessages<T> messages(grid.pp(), untagged_ ? comm::Matching::in_order : comm::Matching::by_tag,
                           exchanges_, plan_.slots[static_cast<std::size_t>(stage_)],
                           [this](const pipeline::Message& m) { return tag(m); });
  Result r;
  auto wait_for = [&](comm::Request& request) {
    Kokkos::Timer timer;
    request.wait();
    r.wait_s += timer.seconds();
  };
  const auto& actions = plan_.actions[static_cast<std::size_t>(stage_)];
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const pipeline::Action& a = actions[i];
    const int s = a.slot;
    const io::Batch& batch = batches.at(static_cast<std::size_t>(a.micro));
    comm::watchdog::set_micro_batch(a.micro);
    const pipeline::Message want = pipeline::receive_before(plan_, stage_, i);
    if (a.op == pipeline::Op::forward) {
      // The slot's input holds the gradient its last backward sends, unless that send
      // is complete: then the slot takes another buffer.
      if (messages.input_busy(s))
        detach_input(model, s);
      if (!plan_.first(stage_, a.chunk) && a.input_from >= 0)
        Kokkos::deep_copy(exec, model.input(s), model.output(a.chunk - 1, a.input_from));
      comm::Request in = messages.post(exec, i, want, &model.input(s));
      wait_for(in);
      model.forward(exec, a.chunk, s, batch.inputs);
    } else {
      if (!plan_.last(stage_, a.chunk) && a.grad_from >= 0)
        Kokkos::deep_copy(exec, model.output_grad(), model.input_grad(a.grad_from));
      comm::Request in = messages.post(exec, i, want, &model.output_grad());
      wait_for(in);
      r.loss_sum += model.backward(exec, a.chunk, s, batch.inputs, batch.targets, grad_scale,
                                   a.last_backward ? done : nullptr);
    }
    const pipeline::Message made = pipeline::send_after(plan_, stage_, i);
    if (made.exists())
      messages.made(
          made, a.op == pipeline::Op::forward ? model.output(a.chunk, s) : model.input_grad(s), s);
  }
  messages.post_last(exec, actions.size());
  comm::watchdog::set_micro_batch(-1);
  Kokkos::Timer timer;
  messages.wait_all();
  r.wait_s += timer.seconds();
  exec.fence();
  return r;
}

template <class T>
void PipelineStage::forward_only(const ExecSpace& exec, model::ShardedGPT<T>& model,
                                 const comm::ProcessGrid& grid,
                                 const std::vector<std::int32_t>& inputs, int m,
                                 const std::function<void()>& head) {
  // Every stage takes (micro-batch, virtual stage) in the same order, in which each message
  // is made before it is needed: a send waited for at once always finds its receive posted
  // in time, with MPI's tags and in NCCL's posting order alike.
  const comm::Matching matching = untagged_ ? comm::Matching::in_order : comm::Matching::by_tag;
  const int p = plan_.stages;
  constexpr int slot = 0;
  const auto transfer = [&](bool send, const kernels::Mat<T>& data, int peer, int tag) {
    comm::Batch batch(grid.pp(), matching);
    if (send)
      batch.send(data, peer, tag);
    else
      batch.recv(data, peer, tag);
    std::vector<comm::Request> requests = batch.post(exec);
    comm::wait_all(requests);
  };
  comm::watchdog::set_micro_batch(m);
  for (int c = 0; c < plan_.chunks; ++c) {
    const int v = plan_.virtual_stage(stage_, c);
    if (plan_.local_prev(c))
      Kokkos::deep_copy(exec, model.input(slot), model.output(c - 1, slot));
    else if (!plan_.first(stage_, c))
      transfer(false, model.input(slot), (stage_ + p - 1) % p, tag(false, v - 1, m));
    model.forward(exec, c, slot, inputs);
    if (plan_.last(stage_, c))
      head();
    else if (!plan_.local_next(stage_, c))
      transfer(true, model.output(c, slot), (stage_ + 1) % p, tag(false, v, m));
  }
  comm::watchdog::set_micro_batch(-1);
}

template <class T>
double PipelineStage::evaluate(const ExecSpace& exec, model::ShardedGPT<T>& model,
                               const comm::ProcessGrid& grid,
                               const std::vector<io::Batch>& batches) {
  double sum = 0;
  for (int m = 0; m < plan_.micro; ++m) {
    const io::Batch& batch = batches.at(static_cast<std::size_t>(m));
    forward_only(exec, model, grid, batch.inputs, m,
                 [&] { sum += model.loss(exec, 0, batch.targets); });
  }
  exec.fence();
  return sum;
}

template <class T>
void PipelineStage::logits(const ExecSpace& exec, model::ShardedGPT<T>& model,
                           const comm::ProcessGrid& grid, const std::vector<std::int32_t>& inputs,
                           const std::vector<std::int32_t>& marks, const kernels::Vec<float>& out) {
  forward_only(exec, model, grid, inputs, 0, [&] { model.logits(exec, 0, marks, out); });
  // The head is on the stage of the last virtual stage.
  if (plan_.stages > 1)
    grid.pp().broadcast(exec, out, (plan_.virtual_stages() - 1) % plan_.stages);
  exec.fence();
}

template double PipelineStage::evaluate<real>(const ExecSpace&, model::ShardedGPT<real>&,
                                              const comm::ProcessGrid&,
                                              const std::vector<io::Batch>&);
template double PipelineStage::evaluate<bf16>(const ExecSpace&, model::ShardedGPT<bf16>&,
                                              const comm::ProcessGrid&,
                                              const std::vector<io::Batch>&);
template void PipelineStage::logits<real>(const ExecSpace&, model::ShardedGPT<real>&,
                                          const comm::ProcessGrid&,
                                          const std::vector<std::int32_t>&,
                                          const std::vector<std::int32_t>&,
                                          const kernels::Vec<float>&);

template PipelineStage::Result PipelineStage::run<real>(const ExecSpace&, model::ShardedGPT<real>&,
                                                        const comm::ProcessGrid&,
                                                        const std::vector<io::Batch>&, double,
                                                        const model::ShardedGPT<real>::UnitDone&);
template PipelineStage::Result PipelineStage::run<bf16>(const ExecSpace&, model::ShardedGPT<bf16>&,
                                                        const comm::ProcessGrid&,
                                                        const std::vector<io::Batch>&, double,
                                                        const model::ShardedGPT<bf16>::UnitDone&);

} // namespace cubelm::train
