// The planner's performance model (docs/planner.md): each pass of a micro-batch through
// a chunk costs its gemms at the machine's rate, its other kernels' memory traffic at the
// memory bandwidth and its tensor-parallel collectives at the alpha-beta cost of the
// network level their group spans; the schedule's timeline with those costs and the
// messages' delays gives the pipeline; the data-parallel buckets, the tied embedding's
// sum, the step's world sums and AdamW follow.

#include "cubelm/cost/predict.hpp"

#include "cubelm/cost/buckets.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/step_sums.hpp"
#include "cubelm/pipeline/timed.hpp"
#include "cubelm/tp/shapes.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace cubelm::cost {

namespace {

// The groups of world rank `rank` under their names, each with the colour its members
// share (comm::memberships: the grid's own split), and the world.
std::vector<std::pair<std::string, long>> group_keys(const comm::Layout& l, int rank) {
  std::vector<std::pair<std::string, long>> keys = {{"world", 0}};
  for (const comm::Membership& m : comm::memberships(l, comm::coords_of(l, rank)))
    keys.emplace_back(m.name, m.color);
  return keys;
}

// Placement of a group's instances given each instance's members.
GroupPlacement placement(const std::map<long, std::vector<int>>& instances, int per_node) {
  GroupPlacement g;
  std::map<int, int> leaving; // node -> instances that span nodes and have a rank on it
  for (const auto& [key, ranks] : instances) {
    g.ranks = static_cast<int>(ranks.size());
    std::set<int> nodes;
    for (const int r : ranks)
      nodes.insert(r / per_node);
    if (nodes.size() < 2)
      continue;
    g.inter = true;
    for (const int n : nodes)
      g.sharing = std::max(g.sharing, ++leaving[n]);
  }
  return g;
}

// Kernels other than gemms, as passes over a layer's saved activations (write and read
// forward; read them, write and read their gradients backward): accesses per element,
// each of a stored value's bytes (cost::value_bytes).
constexpr double kForwardAccesses = 2, kBackwardAccesses = 4;

} // namespace

std::map<std::string, GroupPlacement> place_groups(const comm::Layout& layout,
                                                   int devices_per_node) {
  std::map<std::string, std::map<long, std::vector<int>>> instances;
  for (int r = 0; r < layout.world_size(); ++r)
    for (const auto& [name, key] : group_keys(layout, r))
      instances[name][key].push_back(r);
  std::map<std::string, GroupPlacement> out;
  for (const auto& [name, groups] : instances)
    out[name] = placement(groups, devices_per_node);
  // Pipeline messages: stage s to s + 1 (mod p), every (dp, cp, tp) triple at once.
  for (int s = 0; s < layout.pp && layout.pp > 1; ++s) {
    std::map<long, std::vector<int>> pairs;
    for (int d = 0; d < layout.dp; ++d)
      for (int c = 0; c < layout.cp; ++c)
        for (int t = 0; t < layout.tp; ++t)
          pairs[t + static_cast<long>(layout.tp) * (c + static_cast<long>(layout.cp) * d)] = {
              comm::world_rank_of(layout, d, s, t, c),
              comm::world_rank_of(layout, d, (s + 1) % layout.pp, t, c)};
    out["pp>" + std::to_string(s)] = placement(pairs, devices_per_node);
  }
  return out;
}

double collective_seconds(comm::Kind kind, const GroupPlacement& where, double calls, double bytes,
                          const io::Machine& machine) {
  const io::NetworkLevel& level = where.inter ? machine.inter : machine.intra;
  const double bandwidth = where.inter
                               ? std::min(machine.intra.bandwidth_gbs,
                                          machine.inter.bandwidth_gbs / std::max(1, where.sharing))
                               : machine.intra.bandwidth_gbs;
  const double p = where.ranks;
  double steps = 0;
  switch (kind) {
  case comm::Kind::all_reduce: // small ones go up and down a tree, large ones round a ring
    steps = p > 1 ? 2 * std::ceil(std::log2(p)) : 0;
    break;
  case comm::Kind::all_gather:
  case comm::Kind::reduce_scatter:
  case comm::Kind::broadcast:
  case comm::Kind::reduce:
  case comm::Kind::all_to_all: // one message to each other rank
    steps = p - 1;
    break;
  case comm::Kind::send:
    steps = 1;
    break;
  case comm::Kind::recv:
    steps = 0;
    break;
  }
  return bytes / (bandwidth * 1e9) + calls * steps * level.latency_us * 1e-6;
}

double Prediction::exposed_comm_s() const {
  double sum = 0;
  for (const auto& [group, s] : comm_s)
    sum += s;
  return sum;
}

namespace {

// One micro-batch's pass costs of a unit, split into compute and communication by group.
struct Cost {
  double forward = 0, backward = 0; // compute (gemms and memory traffic)
  std::map<std::string, double> comm_forward, comm_backward;
  double total_forward() const {
    double t = forward;
    for (const auto& [g, s] : comm_forward)
      t += s;
    return t;
  }
  double total_backward() const {
    double t = backward;
    for (const auto& [g, s] : comm_backward)
      t += s;
    return t;
  }
};

// The tensor-parallel communication of `work`, as tp::collectives describes each pass:
// the forward's collectives before the backward, unless the forward is a recomputation
// (`recomputed`), which runs in the backward.
void add_comm(Cost& cost, const Deck& deck, const UnitWork& work, bool recomputed,
              const std::map<std::string, GroupPlacement>& where, const io::Machine& machine) {
  for (const tp::Pass pass : {tp::Pass::forward, tp::Pass::backward})
    for (const TrafficVolume& v : tensor_parallel_traffic(deck, work, pass)) {
      const double s = collective_seconds(v.kind, where.at(v.group), static_cast<double>(v.calls),
                                          v.bytes, machine);
      (pass == tp::Pass::forward && !recomputed ? cost.comm_forward
                                                : cost.comm_backward)[v.group] += s;
    }
}

} // namespace

Prediction predict(const Deck& deck, const io::Machine& machine, const PredictOptions& options) {
  const ParallelConfig& par = deck.parallel;
  const ModelConfig& cfg = deck.model;
  const comm::Layout layout = comm::layout_of(par);
  const pipeline::PipelinePlan plan = pipeline::make_plan(par, cfg);
  Prediction out;
  for (int s = 0; s < plan.stages; ++s) {
    out.stage_memory.push_back(stage_memory(deck, plan, s));
    if (out.stage_memory.back().total() > out.memory.total())
      out.memory = out.stage_memory.back();
  }
  out.fits = static_cast<double>(out.memory.total()) <= machine.memory_gib * 1073741824.0;
  if (options.memory_first && !out.fits)
    return out;
  const std::map<std::string, GroupPlacement> placed =
      options.placement ? std::map<std::string, GroupPlacement>{}
                        : place_groups(layout, machine.devices_per_node);
  const auto& where = options.placement ? *options.placement : placed;
  const int p = plan.stages, tp = layout.tp;
  const double m = par.microbatches, b = deck.micro_batch();
  // N: the tokens of a micro-batch on this rank (a share of each sequence with context
  // parallelism), whose queries see up to T keys.
  const double H = cfg.hidden, T = cfg.seq_len, N = b * T / layout.cp;
  const double V = static_cast<double>(tp::padded_vocab(cfg, layout));
  const double rate = machine.peak_flops(deck.train.precision) * machine.gemm_efficiency;
  const double memory_rate = machine.memory_gbs * 1e9;
  // Activations, logits and messages are stored values (2 bytes under bf16).
  const double values = value_bytes(deck.train.precision);
  const double forward_bytes = kForwardAccesses * values,
               backward_bytes = kBackwardAccesses * values;

  // This rank's rows and columns of a layer's activations (cost/shape.hpp's n, r, ho,
  // hi and local attention scores) and its share of the vocabulary's logits.
  // With context parallelism a layer saves one log-sum-exp per query row, not its scores.
  const double keys_seen = layout.cp > 1 ? 1 : T;
  const tp::ActivationSplit split = tp::activation_split(layout);
  const double n = N / split.sequences, r = n / split.stream_rows, ho = H / split.outer,
               hi = H / split.inner, scores = n * (cfg.heads / double(split.heads)) * keys_seen,
               logits = n * V / split.inner;
  const double saved = 2 * n * ho + 16 * n * hi + scores + 4 * r;
  Cost layer, recompute, head, lookup;
  layer.forward =
      (24 * N * H * H + 4 * N * T * H) / tp / rate + forward_bytes * saved / memory_rate;
  layer.backward =
      2 * (24 * N * H * H + 4 * N * T * H) / tp / rate + backward_bytes * saved / memory_rate;
  add_comm(layer, deck, UnitWork{false, false, 1, 0}, false, where, machine);
  recompute.backward = layer.forward;
  add_comm(recompute, deck, UnitWork{false, false, 0, 1}, true, where, machine);
  // Context parallelism (cost/traffic.hpp): the keys and values of this rank's chunks
  // all-gathered forward (again in a recomputed forward) and backward, their gradient
  // reduce-scattered backward.
  Cost context;
  if (layout.cp > 1) {
    const double block = 2 * n * hi * values;
    const GroupPlacement& cp = where.at("cp");
    const double gather = collective_seconds(comm::Kind::all_gather, cp, 1, block, machine);
    context.comm_forward["cp"] = gather;
    context.comm_backward["cp"] =
        gather + collective_seconds(comm::Kind::reduce_scatter, cp, 1, block, machine);
    layer.comm_forward["cp"] += context.comm_forward["cp"];
    layer.comm_backward["cp"] += context.comm_backward["cp"];
    recompute.comm_backward["cp"] += gather;
  }
  head.forward = 2 * N * H * V / tp / rate + 3 * values * logits / memory_rate;
  head.backward = 4 * N * H * V / tp / rate + 2 * values * logits / memory_rate;
  add_comm(head, deck, UnitWork{false, true, 0, 0}, false, where, machine);
  lookup.forward = forward_bytes * n * ho / memory_rate;
  lookup.backward = backward_bytes * n * ho / memory_rate;
  add_comm(lookup, deck, UnitWork{true, false, 0, 0}, false, where, machine);
  const bool recomputing = par.recompute == Recompute::full;
  // An MoE layer: attention (8 N H^2 + 4 N T H), the router
  // (2 N H E) and k expert MLPs per token (16 k N H^2), all split over the tp ranks (each
  // routes N / tp tokens); with expert parallelism the rows go to their experts and back in
  // forward (with the row counts) and in backward, balanced routing assumed
  // (cost/traffic.hpp).
  Cost moe_layer, moe_recompute;
  if (cfg.experts > 1) {
    const double k = cfg.top_k, flops = (8 * N * H * H + 4 * N * T * H + 2 * N * H * cfg.experts +
                                         16 * k * N * H * H) /
                                        tp;
    // The tokens a rank routes: its share, or the group's with expert tensor parallelism.
    const double routed = layout.etp > 1 ? N : N / tp;
    const double kept = static_cast<double>(tp::moe_rows(
        cfg.capacity_factor, static_cast<std::int64_t>(routed), cfg.top_k, cfg.experts));
    const double moe_saved = 2 * n * ho + 4 * n * hi + scores + 4 * r + 13 * kept * H;
    moe_layer.forward = flops / rate + forward_bytes * moe_saved / memory_rate;
    moe_layer.backward = 2 * flops / rate + backward_bytes * moe_saved / memory_rate;
    add_comm(moe_layer, deck, UnitWork{false, false, 1, 0, 1, 0}, false, where, machine);
    moe_recompute.backward = moe_layer.forward;
    add_comm(moe_recompute, deck, UnitWork{false, false, 0, 1, 0, 1}, true, where, machine);
    if (layout.cp > 1) {
      moe_layer.comm_forward["cp"] += context.comm_forward["cp"];
      moe_layer.comm_backward["cp"] += context.comm_backward["cp"];
      moe_recompute.comm_backward["cp"] += context.comm_forward["cp"];
    }
    if (layout.ep > 1) {
      const double e = layout.ep, rows = (e - 1) / e * kept * H * values;
      const double counts = (e - 1) * (cfg.experts / layout.ep) * 4;
      const auto exchange = [&](double calls) {
        return collective_seconds(comm::Kind::all_to_all, where.at("ep"), calls, calls * rows,
                                  machine);
      };
      const double count_s =
          collective_seconds(comm::Kind::all_to_all, where.at("ep"), 1, counts, machine);
      moe_layer.comm_forward["ep"] += exchange(2) + count_s;
      moe_layer.comm_backward["ep"] += exchange(2);
      moe_recompute.comm_backward["ep"] += exchange(2) + count_s;
    }
  }

  // Pass costs, and per stage the compute and communication they hold.
  pipeline::PassCosts costs;
  std::vector<double> compute(static_cast<std::size_t>(p), 0.0);
  std::vector<std::map<std::string, double>> comm(static_cast<std::size_t>(p));
  const auto add = [&](std::size_t s, const Cost& c, double times, double& f, double& bw) {
    f += times * c.total_forward();
    bw += times * c.total_backward();
    compute[s] += m * times * (c.forward + c.backward);
    for (const auto& [g, t] : c.comm_forward)
      comm[s][g] += m * times * t;
    for (const auto& [g, t] : c.comm_backward)
      comm[s][g] += m * times * t;
  };
  for (int s = 0; s < p; ++s) {
    const auto si = static_cast<std::size_t>(s);
    costs.forward.emplace_back();
    costs.backward.emplace_back();
    for (std::size_t c = 0; c < plan.layers_of[si].size(); ++c) {
      double f = 0, bw = 0, moe = 0;
      for (const int l : plan.layers_of[si][c])
        moe += cfg.moe_layer(l) ? 1 : 0;
      const double layers = static_cast<double>(plan.layers_of[si][c].size()) - moe;
      add(si, layer, layers, f, bw);
      add(si, moe_layer, moe, f, bw);
      if (recomputing) {
        add(si, recompute, layers, f, bw);
        add(si, moe_recompute, moe, f, bw);
      }
      if (plan.first(s, static_cast<int>(c)))
        add(si, lookup, 1, f, bw);
      if (plan.last(s, static_cast<int>(c)))
        add(si, head, 1, f, bw);
      costs.forward.back().push_back(f);
      costs.backward.back().push_back(bw);
    }
  }
  // A message is the residual stream of one micro-batch in the sender's layout.
  const double message = values * r * ho;
  for (int s = 0; s < p; ++s) {
    const double next =
        p > 1 ? collective_seconds(comm::Kind::send, where.at("pp>" + std::to_string(s)), 1,
                                   message, machine)
              : 0;
    const double prev = p > 1
                            ? collective_seconds(comm::Kind::send,
                                                 where.at("pp>" + std::to_string((s + p - 1) % p)),
                                                 1, message, machine)
                            : 0;
    costs.to_next.push_back(next);
    costs.to_prev.push_back(prev);
  }
  const pipeline::TimedTimeline timeline = pipeline::simulate_timed(plan, costs);

  // The unit-cost timeline (pipeline::simulate's, checked equal in tests/cost/test_planner.cpp).
  const pipeline::TimedTimeline unit = pipeline::simulate_timed(plan, pipeline::unit_costs(plan));
  for (int s = 0; s < p; ++s) {
    const auto si = static_cast<std::size_t>(s);
    out.unit_bubble.push_back(unit.busy[si] > 0 ? unit.idle[si] / unit.busy[si] : 0.0);
  }
  const int d = layout.replicas();
  const bool zero = par.zero == 1 && d > 1;
  std::vector<double> end(static_cast<std::size_t>(p), 0.0), optimizer(end), gather(end);
  std::vector<double> dp_tail(end), ends_tail(end);
  for (int s = 0; s < p; ++s) {
    const auto si = static_cast<std::size_t>(s);
    out.stage_traffic.push_back(traffic_per_step(deck, plan, s));
    // Data parallelism: each bucket is reduced once the last backward through its units
    // has passed them, one after the other on the network, overlapping the backward.
    const StageBuckets buckets = stage_buckets(deck, plan, s);
    double network = 0, shard = 0, params = 0;
    const auto& chunks = plan.layers_of[si];
    for (std::size_t k = 0; k < buckets.plan.size.size(); ++k) {
      const double size = static_cast<double>(buckets.plan.size[k]);
      // The experts' buckets go over edp (dp x cp x tp / ep ranks) with expert parallelism.
      const bool expert = buckets.plan.expert[k] && layout.ep > 1;
      const int ranks = expert ? d / layout.expert_replicas() : d;
      const std::string group = expert ? "edp" : "dp";
      params += size;
      shard += zero ? size / ranks : size;
      if (ranks == 1)
        continue;
      const int unit = buckets.done[k];
      double ready = timeline.done[si];
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        const double start = timeline.last_backward_start[si][c];
        const double stop = timeline.last_backward_end[si][c];
        const bool last = plan.last(s, static_cast<int>(c));
        const double per_layer =
            layer.total_backward() + (recomputing ? recompute.total_backward() : 0);
        const double after_head = start + (last ? head.total_backward() : 0);
        if (unit == cfg.layers && last)
          ready = after_head;
        else if (unit == -1 && plan.first(s, static_cast<int>(c)))
          ready = stop;
        else
          for (std::size_t j = 0; j < chunks[c].size(); ++j)
            if (chunks[c][j] == unit)
              ready = after_head + static_cast<double>(chunks[c].size() - j) * per_layer;
      }
      const double bytes =
          zero ? (ranks - 1.0) * 4 * size / ranks : 2 * (ranks - 1.0) / d * 4 * size;
      network = std::max(network, ready) +
                collective_seconds(zero ? comm::Kind::reduce_scatter : comm::Kind::all_reduce,
                                   where.at(group), 1, bytes, machine);
      if (zero)
        gather[si] += collective_seconds(comm::Kind::all_gather, where.at(group), 1,
                                         (ranks - 1.0) * 4 * size / ranks, machine);
    }
    dp_tail[si] = std::max(0.0, network - timeline.done[si]);
    for (const TrafficVolume& v : out.stage_traffic.back())
      if (v.group == "pp.ends")
        ends_tail[si] += collective_seconds(v.kind, where.at(v.group), static_cast<double>(v.calls),
                                            v.bytes, machine);
    // AdamW reads the value, gradient and two moments and writes three of them; the
    // gradient norm reads every gradient once more.
    optimizer[si] = 4 * (7 * shard + params) / memory_rate;
    end[si] = timeline.done[si] + dp_tail[si] + ends_tail[si] + optimizer[si] + gather[si];
  }
  const auto critical =
      static_cast<std::size_t>(std::max_element(end.begin(), end.end()) - end.begin());
  const double world = layout.world_size() > 1
                           ? collective_seconds(comm::Kind::all_reduce, where.at("world"), 1,
                                                2.0 * (layout.world_size() - 1) /
                                                    layout.world_size() * 8 * StepSums::count(deck),
                                                machine)
                           : 0;
  out.critical_stage = static_cast<int>(critical);
  out.step_s = end[critical] + world;
  out.compute_s = compute[critical];
  out.optimizer_s = optimizer[critical];
  out.comm_s = comm[critical];
  if (d > 1)
    out.comm_s["dp"] = dp_tail[critical] + gather[critical];
  if (ends_tail[critical] > 0)
    out.comm_s["pp.ends"] = ends_tail[critical];
  if (world > 0)
    out.comm_s["world"] = world;
  out.idle_s = std::max(0.0, out.step_s - out.compute_s - out.exposed_comm_s() - out.optimizer_s);
  // Checkpoints stop every rank while they are written: their time, spread over the steps
  // between two saves, adds to every step.
  out.checkpoint_bytes = static_cast<double>(checkpoint_bytes(cfg));
  if (machine.checkpoint_gbs > 0) {
    out.checkpoint_s = out.checkpoint_bytes / (machine.checkpoint_gbs * 1e9);
    out.checkpoint_step_s = out.checkpoint_s / steps_per_save(deck);
    out.step_s += out.checkpoint_step_s;
  }

  for (const TrafficVolume& v : out.stage_traffic.front())
    out.comm_bytes += v.bytes;
  out.tokens = static_cast<double>(deck.train.global_batch) * T;
  out.model_flops = flops_per_token(cfg) * out.tokens;
  out.tflops_per_device = out.model_flops / out.step_s / layout.world_size() / 1e12;
  out.mfu =
      out.model_flops / out.step_s / layout.world_size() / machine.peak_flops(deck.train.precision);
  return out;
}

int steps_per_save(const Deck& deck) {
  return std::max(1, deck.checkpoint.interval > 0 ? deck.checkpoint.interval : deck.train.steps);
}

} // namespace cubelm::cost
