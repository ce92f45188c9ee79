#include "cubelm/pipeline/schedule.hpp"

#include "cubelm/pipeline/timed.hpp"

#include "cubelm/core/error.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace cubelm::pipeline {

int PipelinePlan::virtual_stages() const {
  return schedule == Schedule::layered ? layers : stages * chunks;
}

PlanProblem check_plan(Schedule schedule, int stages, int micro, int virtual_stages, int layers) {
  const std::string p = std::to_string(stages), m = std::to_string(micro);
  const std::string v = std::to_string(virtual_stages), l = std::to_string(layers);
  if (stages < 1)
    return {"parallel.pipeline_size", p, "must be at least 1"};
  if (micro < 1)
    return {"parallel.microbatches", m, "must be at least 1"};
  if (virtual_stages < 1)
    return {"parallel.virtual_stages", v, "must be at least 1"};
  if (virtual_stages > 1 && schedule != Schedule::interleaved)
    return {"parallel.virtual_stages", v,
            "more than one virtual stage needs schedule = \"interleaved\""};
  if (layers < stages)
    return {"model.layers", l, "every pipeline stage needs a layer (pipeline_size = " + p + ")"};
  if (schedule == Schedule::interleaved) {
    if (micro % stages != 0)
      return {"parallel.microbatches", m,
              "schedule = \"interleaved\" needs microbatches divisible by pipeline_size = " + p};
    if (layers % (stages * virtual_stages) != 0)
      return {"model.layers", l,
              "schedule = \"interleaved\" needs layers divisible by pipeline_size x "
              "virtual_stages = " +
                  p + " x " + v};
  }
  return {};
}

namespace {

// Megatron-LM's interleaved order: the k-th forward (or backward) of a stage takes
// micro-batches in groups of p per chunk.
Action interleaved(int k, bool forward, int p, int v) {
  const int group = k / p;
  const int chunk = forward ? group % v : v - 1 - group % v;
  return Action{forward ? Op::forward : Op::backward, (k / (p * v)) * p + k % p, chunk, -1};
}

std::vector<Action> order(Schedule schedule, int stage, int p, int m, int v, int chunks) {
  std::vector<Action> a;
  auto f = [&](int micro, int chunk) { a.push_back({Op::forward, micro, chunk, -1}); };
  auto b = [&](int micro, int chunk) { a.push_back({Op::backward, micro, chunk, -1}); };
  if (schedule == Schedule::gpipe) {
    for (int i = 0; i < m; ++i)
      f(i, 0);
    for (int i = 0; i < m; ++i)
      b(i, 0);
  } else if (schedule == Schedule::one_f_one_b) {
    const int warm = std::min(p - stage - 1, m);
    for (int i = 0; i < warm; ++i)
      f(i, 0);
    for (int i = 0; i < m - warm; ++i) {
      f(warm + i, 0);
      b(i, 0);
    }
    for (int i = m - warm; i < m; ++i)
      b(i, 0);
  } else if (schedule == Schedule::interleaved) {
    const int total = m * v;
    const int warm = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warm; ++k)
      a.push_back(interleaved(k, true, p, v));
    for (int k = 0; k < total - warm; ++k) {
      a.push_back(interleaved(warm + k, true, p, v));
      a.push_back(interleaved(k, false, p, v));
    }
    for (int k = total - warm; k < total; ++k)
      a.push_back(interleaved(k, false, p, v));
  } else { // layered
    for (int c = 0; c < chunks; ++c)
      for (int i = 0; i < m; ++i)
        f(i, c);
    for (int c = chunks; c-- > 0;)
      for (int i = 0; i < m; ++i)
        b(i, c);
  }
  return a;
}

// Activation slots from a free list, lowest free first at a forward. With one stage
// (p = 1) the previous chunk is on this rank: a forward copies its output from that
// chunk's slot, and a backward leaves its input gradient in its own slot for the
// previous chunk's backward, which reads it and frees it. Returns the slots needed.
int assign_slots(const PipelinePlan& plan, int stage, std::vector<Action>& actions) {
  std::map<std::pair<int, int>, int> slot_of;
  // The free slots, lowest first (a set: gpipe holds thousands of slots at once).
  std::set<int> free;
  int slots = 0;
  const auto release = [&](int s) { free.insert(s); };
  for (Action& a : actions) {
    if (a.op == Op::forward) {
      int s = slots;
      if (free.empty())
        ++slots;
      else {
        s = *free.begin();
        free.erase(free.begin());
      }
      slot_of[{a.micro, a.chunk}] = s;
      a.slot = s;
      if (plan.local_prev(a.chunk))
        a.input_from = slot_of.at({a.micro, a.chunk - 1});
    } else {
      a.slot = slot_of.at({a.micro, a.chunk});
      if (plan.local_next(stage, a.chunk)) {
        a.grad_from = slot_of.at({a.micro, a.chunk + 1});
        release(a.grad_from);
      }
      if (!plan.local_prev(a.chunk)) {
        a.frees = a.slot;
        release(a.slot);
      }
    }
  }
  return slots;
}

} // namespace

PipelinePlan make_plan(Schedule schedule, int stages, int micro, int virtual_stages, int layers) {
  const PlanProblem problem = check_plan(schedule, stages, micro, virtual_stages, layers);
  if (!problem.key.empty())
    throw Error(problem.message(), true);
  PipelinePlan plan;
  plan.schedule = schedule;
  plan.stages = stages;
  plan.micro = micro;
  plan.layers = layers;
  const int p = stages;
  plan.layers_of.resize(static_cast<std::size_t>(p));
  if (schedule == Schedule::layered) {
    plan.chunks = (layers + p - 1) / p;
    for (int l = 0; l < layers; ++l)
      plan.layers_of[static_cast<std::size_t>(l % p)].push_back({l});
  } else {
    plan.chunks = schedule == Schedule::interleaved ? virtual_stages : 1;
    // Virtual stage k gets L / (p v) layers, the first L % (p v) one more.
    const int n = p * plan.chunks, base = layers / n, extra = layers % n;
    int next = 0;
    for (int k = 0; k < n; ++k) {
      std::vector<int> ids;
      for (int i = 0; i < base + (k < extra ? 1 : 0); ++i)
        ids.push_back(next++);
      plan.layers_of[static_cast<std::size_t>(k % p)].push_back(ids);
    }
  }
  for (int s = 0; s < p; ++s) {
    const int chunks = static_cast<int>(plan.layers_of[static_cast<std::size_t>(s)].size());
    std::vector<Action> a = order(schedule, s, p, micro, plan.chunks, chunks);
    plan.slots.push_back(assign_slots(plan, s, a));
    for (int c = 0; c < chunks; ++c)
      for (auto it = a.rbegin(); it != a.rend(); ++it)
        if (it->op == Op::backward && it->chunk == c) {
          it->last_backward = true;
          break;
        }
    plan.actions.push_back(std::move(a));
  }
  return plan;
}

PipelinePlan make_plan(const ParallelConfig& parallel, const ModelConfig& model) {
  return make_plan(parallel.schedule, parallel.pipeline_size, parallel.microbatches,
                   parallel.virtual_stages, model.layers);
}

double Timeline::bubble(int stage) const {
  const auto s = static_cast<std::size_t>(stage);
  return busy[s] > 0 ? idle[s] / busy[s] : 0.0;
}

Timeline simulate(const PipelinePlan& plan, double forward_cost, double backward_cost) {
  // The timed timeline with unit costs and no delays (pipeline/timed.hpp), its passes
  // recorded; here the idle gaps between them and the activation sets in flight.
  std::vector<std::vector<Interval>> passes;
  const TimedTimeline timed =
      simulate_timed(plan, unit_costs(plan, forward_cost, backward_cost), &passes);
  Timeline t;
  t.makespan = timed.makespan;
  t.busy = timed.busy;
  t.idle = timed.idle;
  t.stages.resize(passes.size());
  t.peak_in_flight.assign(passes.size(), 0);
  for (std::size_t s = 0; s < passes.size(); ++s) {
    double free = 0;
    int held = 0;
    for (const Interval& pass : passes[s]) {
      if (pass.start > free)
        t.stages[s].push_back({Interval::idle, -1, -1, free, pass.start - free});
      t.stages[s].push_back(pass);
      free = pass.start + pass.length;
      held += pass.kind == Interval::forward ? 1 : -1;
      t.peak_in_flight[s] = std::max(t.peak_in_flight[s], held);
    }
    if (t.makespan > free)
      t.stages[s].push_back({Interval::idle, -1, -1, free, t.makespan - free});
  }
  return t;
}

} // namespace cubelm::pipeline
