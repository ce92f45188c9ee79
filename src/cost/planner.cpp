// The layouts a planner considers and their ranking. Enumeration follows the same rules
// the deck reader applies (one source each: comm::Layout, tp::check_shapes,
// pipeline::check_plan), so every layout listed is one `cubelm train` accepts.

#include "cubelm/cost/planner.hpp"

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/pipeline/schedule.hpp"
#include "cubelm/tp/shapes.hpp"

#include <algorithm>
#include <map>
#include <sstream>

namespace cubelm::cost {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

struct Schedules {
  Schedule schedule;
  int virtual_stages;
};

std::vector<Schedules> schedules(int pp, int dp, int micro, int layers) {
  if (pp == 1) {
    std::vector<Schedules> out = {{Schedule::one_f_one_b, 1}};
    if (micro > 1 && dp > 1)
      out.push_back({Schedule::layered, 1});
    return out;
  }
  std::vector<Schedules> out = {
      {Schedule::gpipe, 1}, {Schedule::one_f_one_b, 1}, {Schedule::layered, 1}};
  for (int v = 2; v * pp <= layers; ++v)
    out.push_back({Schedule::interleaved, v});
  return out;
}

} // namespace

std::vector<Deck> layouts(const Deck& base, int ranks, const SearchSpace& space) {
  if (ranks < 1)
    throw Error("--ranks = " + std::to_string(ranks) + ": the number of ranks must be at least 1",
                true);
  const std::vector<TensorMode> modes =
      space.modes.empty() ? std::vector<TensorMode>{TensorMode::none, TensorMode::d1,
                                                    TensorMode::d2, TensorMode::d3}
                          : space.modes;
  const std::vector<Precision> precisions =
      space.precisions.empty() ? std::vector<Precision>{base.train.precision} : space.precisions;
  const ModelConfig& model = base.model;
  const int batch = base.train.global_batch;
  std::vector<Deck> out;
  const auto allowed = [](const auto& list, auto value) {
    return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
  };
  const std::vector<int> contexts = space.context_sizes.empty()
                                        ? std::vector<int>{base.parallel.context_size}
                                        : space.context_sizes;
  for (const int cp : contexts)
    for (const TensorMode mode : modes)
      for (const int tp : comm::tensor_sizes(mode, ranks))
        for (const int pp : divisors(ranks / tp)) {
          if (cp < 1 || model.seq_len % (2 * cp) != 0 || (ranks / tp / pp) % cp != 0 ||
              pp > model.layers || !allowed(space.tensor_sizes, tp) ||
              !allowed(space.pipeline_sizes, pp))
            continue;
          const int dp = ranks / tp / pp / cp;
          // MoE layers: the experts spread over the tp ranks and ep / tp of the dp x cp
          // replicas, or with expert tensor parallelism (a deck's expert_tensor_size > 1:
          // the experts split over every tp > 1) over ep of them.
          const int ep = base.parallel.expert_size;
          const bool moe = model.experts > 1, etp = base.parallel.expert_tensor_size > 1 && tp > 1;
          if (batch % dp != 0 || (etp && (dp * cp) % ep != 0) ||
              (!etp && ep > 1 && (ep % tp != 0 || (dp * cp) % (ep / tp) != 0)) ||
              (moe && !etp && tp > 1 && ep == 1))
            continue;
          for (const int micro : divisors(batch / dp)) {
            const int sequences = batch / dp / micro;
            for (const bool sp : {false, true}) {
              if (sp && (!comm::splits_sequences(mode) || tp == 1))
                continue;
              comm::Layout layout{dp, pp, tp, mode, sp};
              layout.cp = cp;
              if (!tp::check_shapes(layout, model, sequences).empty())
                continue;
              for (const Schedules& s : schedules(pp, dp, micro, model.layers)) {
                if (!pipeline::check_plan(s.schedule, pp, micro, s.virtual_stages, model.layers)
                         .key.empty())
                  continue;
                for (const int zero : {0, 1}) {
                  if (zero == 1 && dp * cp == 1)
                    continue;
                  for (const Recompute recompute : {Recompute::none, Recompute::full})
                    for (const Precision precision : precisions) {
                      if (!allowed(space.recompute, recompute))
                        continue;
                      Deck d = base;
                      ParallelConfig& p = d.parallel;
                      p.tensor_mode = mode;
                      p.tensor_size = tp;
                      p.expert_tensor_size = etp ? tp : 1;
                      p.pipeline_size = pp;
                      p.data_size = dp;
                      p.context_size = cp;
                      p.schedule = s.schedule;
                      p.virtual_stages = s.virtual_stages;
                      p.microbatches = micro;
                      p.zero = zero;
                      p.sequence_parallel = sp;
                      p.recompute = recompute;
                      d.train.precision = precision;
                      out.push_back(std::move(d));
                    }
                }
              }
            }
          }
        }
  return out;
}

Ranking rank_layouts(const Deck& base, int ranks, const io::Machine& machine,
                     const SearchSpace& space) {
  Ranking ranking;
  std::vector<Candidate>& out = ranking.fit;
  // Layouts of the same grid share the groups' placement on nodes.
  std::map<std::string, std::map<std::string, GroupPlacement>> placements;
  std::vector<Deck> all = layouts(base, ranks, space);
  ranking.considered = all.size();
  for (Deck& d : all) {
    const comm::Layout layout = comm::layout_of(d.parallel);
    const std::string grid = layout.describe();
    auto found = placements.find(grid);
    if (found == placements.end())
      found = placements.emplace(grid, place_groups(layout, machine.devices_per_node)).first;
    PredictOptions options;
    options.placement = &found->second;
    options.memory_first = true;
    Prediction p = predict(d, machine, options);
    if (p.fits)
      out.push_back({std::move(d), std::move(p)});
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return ranks_before(a.prediction, b.prediction);
  });
  return ranking;
}

bool ranks_before(const Prediction& a, const Prediction& b) {
  if (a.step_s != b.step_s)
    return a.step_s < b.step_s;
  return a.memory.total() < b.memory.total();
}

std::string layout_line(const Deck& deck) {
  const ParallelConfig& p = deck.parallel;
  std::ostringstream out;
  out << comm::layout_of(p).describe() << " " << schedule_name(p.schedule);
  if (p.schedule == Schedule::interleaved)
    out << ":" << p.virtual_stages;
  out << " m=" << p.microbatches << " zero=" << p.zero
      << " recompute=" << recompute_name(p.recompute) << " "
      << precision_name(deck.train.precision);
  return out.str();
}

} // namespace cubelm::cost
