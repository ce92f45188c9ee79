// Closed forms of a step's traffic (docs/communication.md). Each tensor-parallel mode's
// collectives are tallied per micro-batch for the three kinds of unit a stage may
// hold: the embedding lookup, a transformer layer (its forward part again when the
// layer is recomputed) and the head (ln_f, logits, loss); then the pipeline's
// messages, the data-parallel buckets and the step's world all-reduce are added.

#include "cubelm/cost/traffic.hpp"

#include "cubelm/comm/layout.hpp"
#include "cubelm/cost/buckets.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/cost/step_sums.hpp"
#include "cubelm/pipeline/messages.hpp"
#include "cubelm/pipeline/schedule.hpp"
#include "cubelm/tp/collectives.hpp"
#include "cubelm/tp/shapes.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

namespace cubelm::cost {

namespace {

using comm::Kind;

// Calls and the sum of message bytes (B of the cost model) per (group, kind), with
// each group's size; modelled bytes are linear in B, so sums convert at the end.
class Tally {
public:
  void size(const std::string& group, int ranks) { sizes_[group] = ranks; }
  // `calls` calls of `kind` on `group` whose messages add up to `elements` floats.
  void add(const std::string& group, Kind kind, double calls, double elements,
           double bytes_per_element = 4) {
    Cell& c = cells_[{group, kind}];
    c.calls += calls;
    c.message_bytes += elements * bytes_per_element;
  }
  std::vector<TrafficVolume> volumes() const {
    std::vector<TrafficVolume> out;
    for (const auto& [key, c] : cells_) {
      const int ranks = sizes_.at(key.first);
      if (c.calls == 0)
        continue;
      out.push_back({key.first, key.second, static_cast<std::uint64_t>(c.calls + 0.5),
                     comm::modeled_bytes_sent(key.second, ranks, c.message_bytes)});
    }
    return out;
  }

private:
  struct Cell {
    double calls = 0, message_bytes = 0;
  };
  std::map<std::pair<std::string, Kind>, Cell> cells_;
  std::map<std::string, int> sizes_;
};

using Units = UnitWork;

// The tensor-parallel collectives of `u`, times `m` micro-batches of N tokens on this rank
// (tp/collectives.hpp describes each piece): a layer's forward runs again when recomputed.
void tensor_parallel(Tally& t, const comm::Layout& layout, const ModelConfig& cfg, double n_tokens,
                     const Units& u, double m, int values,
                     std::optional<tp::Pass> only = std::nullopt) {
  for (const auto& [group, ranks] : tp::collective_groups(layout))
    t.size(group, ranks);
  const double in = u.lookup ? 1 : 0, out = u.head ? 1 : 0, table = u.lookup || u.head ? 1 : 0;
  const double dense = u.layers - u.moe, dense_again = u.recomputed - u.moe_recomputed;
  const struct {
    tp::Piece piece;
    double forwards, backwards;
  } runs[] = {{tp::Piece::lookup, in, in},
              {tp::Piece::attention, u.layers + u.recomputed, u.layers},
              {tp::Piece::mlp, dense + dense_again, dense},
              {tp::Piece::moe, u.moe + u.moe_recomputed, u.moe},
              {tp::Piece::head, out, out},
              {tp::Piece::table, table, table}};
  for (const auto& r : runs)
    for (const tp::Pass pass : {tp::Pass::forward, tp::Pass::backward}) {
      const double times = m * (pass == tp::Pass::forward ? r.forwards : r.backwards);
      if (times == 0 || (only && *only != pass))
        continue;
      for (const tp::Collective& c : tp::collectives(layout, cfg, n_tokens, r.piece, pass))
        t.add(c.group, c.kind, times * c.calls, times * c.elements, tp::element_bytes(c, values));
    }
}

// Elements of one rank's block of parameter `e` in the layout's tensor mode
// (cost/shape.hpp parameters_per_rank, parameter by parameter).
// wte is held with the padded vocabulary's rows.
std::int64_t local_size(const ParamEntry& e, const comm::Layout& layout, const ModelConfig& cfg) {
  const std::int64_t p = layout.tp;
  const tp::ParamSplit split = tp::param_split(layout);
  const bool matrix = e.shape.size() == 2;
  const std::int64_t rows = e.tied ? tp::padded_vocab(cfg, layout) : e.shape[0];
  const std::int64_t n = matrix ? rows * e.shape[1] : e.shape[0];
  if (e.name == "wpe")
    return n / split.wpe;
  const auto ends = [&](const char* s) {
    const std::string tail(s);
    return e.name.size() >= tail.size() &&
           e.name.compare(e.name.size() - tail.size(), tail.size(), tail) == 0;
  };
  // An MoE layer's router and experts are whole on a rank (replicated or spread over ep);
  // with expert tensor parallelism the experts' w1, b1 and w2 are split over the tp ranks.
  if (e.expert >= 0)
    return layout.etp > 1 && !ends("/b2") ? n / p : n;
  if (ends("/router"))
    return n;
  if (matrix)
    return n / split.matrix;
  return n / (ends("/bq") || ends("/bk") || ends("/bv") || ends("/b1") ? split.column_bias
                                                                       : split.vector);
}

// parameter_table, made once per model: the planner asks for the buckets of every stage
// of thousands of layouts of one model.
const std::vector<ParamEntry>& table_of(const ModelConfig& m) {
  thread_local ModelConfig key{};
  thread_local std::vector<ParamEntry> table;
  if (table.empty() || key.vocab_size != m.vocab_size || key.seq_len != m.seq_len ||
      key.hidden != m.hidden || key.heads != m.heads || key.layers != m.layers ||
      key.experts != m.experts || key.moe_every != m.moe_every) {
    table = parameter_table(m);
    key = m;
  }
  return table;
}

} // namespace

StageBuckets stage_buckets(const Deck& deck, int stage) {
  return stage_buckets(deck, pipeline::make_plan(deck.parallel, deck.model), stage);
}

StageBuckets stage_buckets(const Deck& deck, const pipeline::PipelinePlan& plan, int stage) {
  const ParallelConfig& par = deck.parallel;
  const comm::Layout layout = comm::layout_of(par);
  const StageLayout s = stage_layout(plan, stage, par.recompute == Recompute::full);
  std::vector<char> layer_here(static_cast<std::size_t>(deck.model.layers), 0);
  for (const auto& chunk : s.chunks)
    for (const int l : chunk)
      layer_here[static_cast<std::size_t>(l)] = 1;
  // The parameters this stage holds, in bucket order (train::DataParallel's rule).
  struct Held {
    int done;
    BucketItem item;
  };
  std::vector<Held> held;
  for (const ParamEntry& e : table_of(deck.model)) {
    const bool here = e.name == "wte"   ? s.first || s.last
                      : e.name == "wpe" ? s.first
                      : e.unit == deck.model.layers
                          ? s.last
                          : layer_here[static_cast<std::size_t>(e.unit)] != 0;
    // A rank holds experts / expert_size experts, all of the same sizes: those of the
    // first expert-parallel rank stand for every rank's.
    if (e.expert >= deck.model.experts / layout.ep)
      continue;
    if (here) {
      const BucketUnit unit = bucket_unit(e, deck.model, s.first);
      held.push_back(
          {unit.done, {unit.key, unit.alone, local_size(e, layout, deck.model), e.expert >= 0}});
    }
  }
  std::stable_sort(held.begin(), held.end(),
                   [](const auto& a, const auto& b) { return bucket_before(a.item, b.item); });
  std::vector<BucketItem> items;
  for (const auto& h : held)
    items.push_back(h.item);
  StageBuckets out;
  out.plan = plan_buckets(
      items, std::max<std::int64_t>(1, static_cast<std::int64_t>(par.bucket_mb * 1e6 / 4)),
      par.zero == 1 ? layout.replicas() : 1,
      par.zero == 1 ? layout.replicas() / layout.expert_replicas() : 1);
  out.done.assign(out.plan.size.size(), deck.model.layers + 1);
  for (std::size_t k = 0; k < held.size(); ++k) {
    int& done = out.done[static_cast<std::size_t>(out.plan.of[k])];
    done = std::min(done, held[k].done);
  }
  return out;
}

std::vector<TrafficVolume> traffic_per_step(const Deck& deck, int stage) {
  return traffic_per_step(deck, pipeline::make_plan(deck.parallel, deck.model), stage);
}

std::vector<TrafficVolume> traffic_per_step(const Deck& deck, const pipeline::PipelinePlan& plan,
                                            int stage) {
  const ParallelConfig& par = deck.parallel;
  const comm::Layout layout = comm::layout_of(par);
  const StageLayout s = stage_layout(plan, stage, par.recompute == Recompute::full);
  const double m = par.microbatches;
  // The tokens of a micro-batch on this rank (a share of each sequence with context
  // parallelism).
  const double n_tokens = static_cast<double>(deck.micro_batch()) * deck.model.seq_len / layout.cp;
  Tally t;
  Units u;
  u.lookup = s.first;
  u.head = s.last;
  for (const auto& chunk : s.chunks)
    u.layers += static_cast<double>(chunk.size());
  u.recomputed = s.recompute ? u.layers : 0;
  for (const auto& chunk : s.chunks)
    for (const int l : chunk)
      u.moe += deck.model.moe_layer(l) ? 1 : 0;
  u.moe_recomputed = s.recompute ? u.moe : 0;
  // Activations and their gradients travel as the model stores them (2 bytes under bf16).
  const int values = value_bytes(deck.train.precision);
  // Counted also on a one-rank group: calls with no bytes.
  tensor_parallel(t, layout, deck.model, n_tokens, u, m, values);

  // The pipeline: a message per chunk boundary crossed, n x ho floats (the residual
  // stream in the tensor-parallel layout); receives are counted with 0 bytes.
  const tp::ActivationSplit split = tp::activation_split(layout);
  if (layout.pp > 1) {
    t.size("pp", layout.pp);
    const double rows = n_tokens / (split.sequences * split.stream_rows),
                 cols = static_cast<double>(deck.model.hidden) / split.outer;
    const auto& actions = plan.actions[static_cast<std::size_t>(stage)];
    for (std::size_t i = 0; i < actions.size(); ++i) {
      if (pipeline::send_after(plan, stage, i).exists())
        t.add("pp", Kind::send, 1, rows * cols, values);
      if (pipeline::receive_before(plan, stage, i).exists())
        t.add("pp", Kind::recv, 1, 0);
    }
  }

  // Context parallelism: per layer and micro-batch, forward all-gathers the keys and values
  // of this rank's two chunks (2 n hi values, bf16 under bf16, n the rows inside a pair and hi its
  // columns) and backward gathers them again (a recomputed forward a third time) and
  // reduce-scatters their gradient (this rank's block: 2 n hi); an MoE layer's router sums
  // its E load fractions over the group in each forward.
  if (layout.cp > 1) {
    t.size("cp", layout.cp);
    const double rows = n_tokens / split.sequences,
                 inner = static_cast<double>(deck.model.hidden) / split.inner;
    const double block = 2 * rows * inner, gathers = m * (2 * u.layers + u.recomputed);
    t.add("cp", Kind::all_gather, gathers, gathers * block, values);
    t.add("cp", Kind::reduce_scatter, m * u.layers, m * u.layers * block, values);
    const double routed = m * (u.moe + u.moe_recomputed);
    t.add("cp", Kind::all_reduce, routed, routed * deck.model.experts);
  }

  // Expert parallelism: per MoE layer and micro-batch, forward sends each rank's row counts
  // (E ints, E / ep for each peer) and its pairs' rows out and the outputs back; backward
  // the outputs' gradient out and the inputs' gradient back (a recomputed forward
  // repeats the forward's three). How many rows go to other ranks depends on the routing:
  // the closed form assumes balanced routing, (ep - 1) / ep of the R rows (R =
  // tp::moe_rows), which the counters meet only on average; at most all R go.
  if (layout.ep > 1) {
    const double moe = u.moe, moe_redo = u.moe_recomputed;
    const double p = layout.ep;
    // The tokens this rank routes: its share under tensor parallelism, or the tensor
    // group's with expert tensor parallelism.
    const double routed = layout.etp > 1 ? n_tokens : n_tokens / layout.tp;
    const double rows = static_cast<double>(tp::moe_rows(deck.model.capacity_factor,
                                                         static_cast<std::int64_t>(routed),
                                                         deck.model.top_k, deck.model.experts));
    const double tokens = (p - 1) / p * rows * deck.model.hidden;
    t.size("ep", layout.ep);
    const double counts = m * (moe + moe_redo), exchanges = m * (4 * moe + 2 * moe_redo);
    t.add("ep", Kind::all_to_all, counts, counts * (p - 1) * (deck.model.experts / layout.ep));
    t.add("ep", Kind::all_to_all, exchanges, exchanges * tokens, values);
  }

  // Data parallelism: the stage's gradient buckets over the replicas (dp x cp ranks), and
  // the tied wte over pp.ends; the experts' buckets go over edp (dp x cp x tp / ep ranks) when
  // expert_size > 1.
  const bool zero = par.zero == 1;
  const int d = layout.replicas();
  const BucketPlan buckets = stage_buckets(deck, plan, stage).plan;
  for (std::size_t b = 0; b < buckets.size.size(); ++b) {
    const bool expert = buckets.expert[b] && layout.ep > 1;
    const int ranks = expert ? d / layout.expert_replicas() : d;
    const std::string group = expert ? "edp" : "dp";
    if (ranks == 1)
      continue;
    t.size(group, ranks);
    const std::int64_t size = buckets.size[b];
    if (zero) {
      t.add(group, Kind::reduce_scatter, 1, static_cast<double>(size / ranks));
      t.add(group, Kind::all_gather, 1, static_cast<double>(size / ranks));
    } else {
      t.add(group, Kind::all_reduce, 1, static_cast<double>(size));
    }
  }
  if (layout.pp > 1 && (s.first || s.last) && !buckets.size.empty()) {
    t.size("pp.ends", 2);
    t.add("pp.ends", Kind::all_reduce, 1,
          static_cast<double>(buckets.size.front() / (zero ? d : 1)));
  }

  // The step's sums over the world (cost/step_sums.hpp), in double.
  const int world = layout.world_size();
  if (world > 1) {
    t.size("world", world);
    t.add("world", Kind::all_reduce, 1, StepSums::count(deck), 8);
  }
  return t.volumes();
}

std::vector<TrafficVolume> tensor_parallel_traffic(const Deck& deck, const UnitWork& work,
                                                   tp::Pass pass) {
  Tally t;
  tensor_parallel(t, comm::layout_of(deck.parallel), deck.model,
                  static_cast<double>(deck.micro_batch()) * deck.model.seq_len /
                      deck.parallel.context_size,
                  work, 1, value_bytes(deck.train.precision), pass);
  return t.volumes();
}

double comm_bytes_per_step(const Deck& deck, int stage) {
  double total = 0;
  for (const TrafficVolume& v : traffic_per_step(deck, stage))
    total += v.bytes;
  return total;
}

} // namespace cubelm::cost
