// Pipeline plans and their unit-cost timelines: every action once and in order,
// every layer on one stage, a timeline that obeys the dependencies (checked
// here slot by slot, apart from simulate), and the makespan, bubble and
// in-flight counts of the closed forms (Narayanan et al. 2021; Lamy-Poirier
// 2021) derived in docs/pipeline.md.

#include "cubelm/core/error.hpp"
#include "cubelm/pipeline/schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>

using namespace cubelm;
using namespace cubelm::pipeline;

namespace {

// The plan of a schedule named as in a deck.
PipelinePlan make_plan(const std::string& schedule, int p, int m, int v, int layers) {
  return pipeline::make_plan(*parse_schedule(schedule), p, m, v, layers);
}
PlanProblem check_plan(const std::string& schedule, int p, int m, int v, int layers) {
  return pipeline::check_plan(*parse_schedule(schedule), p, m, v, layers);
}

// Virtual stages along the model: (stage, chunk) pairs in virtual_stage order.
std::vector<std::pair<int, int>> model_order(const PipelinePlan& plan) {
  std::vector<std::tuple<int, int, int>> k;
  for (int s = 0; s < plan.stages; ++s)
    for (std::size_t c = 0; c < plan.layers_of[static_cast<std::size_t>(s)].size(); ++c)
      k.emplace_back(plan.virtual_stage(s, static_cast<int>(c)), s, static_cast<int>(c));
  std::sort(k.begin(), k.end());
  std::vector<std::pair<int, int>> order;
  for (const auto& [v, s, c] : k)
    order.emplace_back(s, c);
  return order;
}

// Each (micro, chunk) forward once and backward once, after its forward; slots
// never shared by two live sets and taken lowest free first; each chunk's last
// backward marked; the layers, read along the virtual stages, are 0 .. L - 1.
void expect_well_formed(const PipelinePlan& plan) {
  const auto along = model_order(plan);
  ASSERT_FALSE(along.empty());
  int next_layer = 0;
  for (std::size_t k = 0; k < along.size(); ++k) {
    const auto [s, c] = along[k];
    EXPECT_EQ(plan.virtual_stage(s, c), static_cast<int>(k)) << "virtual stages 0 .. K-1";
    EXPECT_EQ(plan.first(s, c), k == 0);
    EXPECT_EQ(plan.last(s, c), k + 1 == along.size());
    const auto& ids = plan.layers_of[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
    EXPECT_FALSE(ids.empty()) << "stage " << s << " chunk " << c << " has no layer";
    for (int l : ids)
      EXPECT_EQ(l, next_layer++) << "stage " << s << " chunk " << c;
  }
  EXPECT_EQ(next_layer, plan.layers);
  for (int s = 0; s < plan.stages; ++s) {
    const auto& chunks = plan.layers_of[static_cast<std::size_t>(s)];
    std::set<std::pair<int, int>> fwd, bwd;
    std::set<int> live;
    std::map<std::pair<int, int>, int> slot_of;
    std::size_t most = 0;
    std::vector<int> last(chunks.size(), -1);
    const auto& actions = plan.actions[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      const std::pair<int, int> key{a.micro, a.chunk};
      if (a.op == Op::forward) {
        EXPECT_TRUE(fwd.insert(key).second);
        int lowest = 0;
        while (live.count(lowest))
          ++lowest;
        EXPECT_EQ(a.slot, lowest) << "the lowest free slot";
        EXPECT_TRUE(live.insert(a.slot).second) << "slot " << a.slot << " in use";
        slot_of[key] = a.slot;
        // One stage: the previous chunk's output is copied from its slot on this rank.
        EXPECT_EQ(a.input_from, plan.local_prev(a.chunk) ? slot_of.at({a.micro, a.chunk - 1}) : -1);
        EXPECT_EQ(a.grad_from, -1);
        EXPECT_EQ(a.frees, -1);
      } else {
        EXPECT_TRUE(fwd.count(key)) << "backward before forward";
        EXPECT_TRUE(bwd.insert(key).second);
        EXPECT_EQ(a.slot, slot_of.at(key));
        EXPECT_TRUE(live.count(a.slot)) << "backward in a slot that holds nothing";
        // Its own slot is freed unless the previous chunk, on this rank, still reads the
        // input gradient there; that chunk's backward frees it.
        EXPECT_EQ(a.frees, plan.local_prev(a.chunk) ? -1 : a.slot);
        EXPECT_EQ(a.grad_from,
                  plan.local_next(s, a.chunk) ? slot_of.at({a.micro, a.chunk + 1}) : -1);
        if (a.grad_from >= 0)
          EXPECT_EQ(live.erase(a.grad_from), 1u) << "gradient read from a free slot";
        if (a.frees >= 0)
          EXPECT_EQ(live.erase(a.frees), 1u);
        last[static_cast<std::size_t>(a.chunk)] = static_cast<int>(i);
      }
      most = std::max(most, live.size());
    }
    EXPECT_TRUE(live.empty()) << "every slot is free at the end of the step";
    EXPECT_EQ(plan.slots[static_cast<std::size_t>(s)], static_cast<int>(most));
    EXPECT_EQ(fwd.size(), static_cast<std::size_t>(plan.micro) * chunks.size());
    EXPECT_EQ(bwd.size(), fwd.size());
    for (std::size_t i = 0; i < actions.size(); ++i)
      if (actions[i].op == Op::backward)
        EXPECT_EQ(actions[i].last_backward,
                  static_cast<int>(i) == last[static_cast<std::size_t>(actions[i].chunk)]);
      else
        EXPECT_FALSE(actions[i].last_backward);
  }
}

// The timeline, checked without simulate's bookkeeping: each stage's slots tile
// [0, makespan], its work slots are its actions in order with n layers x cost,
// and a work slot starts exactly when both the stage and its dependency are done
// (an idle slot only while waiting).
void expect_timeline(const PipelinePlan& plan, const Timeline& t, double fc, double bc) {
  std::map<std::tuple<bool, int, int>, double> end; // (forward, micro, virtual stage)
  std::map<std::tuple<bool, int, int>, double> start;
  for (int s = 0; s < plan.stages; ++s) {
    const auto si = static_cast<std::size_t>(s);
    const auto& actions = plan.actions[si];
    double clock = 0, busy = 0, in_flight = 0, peak = 0;
    std::size_t next = 0;
    for (const Interval& x : t.stages[si]) {
      EXPECT_NEAR(x.start, clock, 1e-9) << "stage " << s << ": slots tile the step";
      EXPECT_GT(x.length, 0.0);
      clock = x.start + x.length;
      if (x.kind == Interval::idle)
        continue;
      ASSERT_LT(next, actions.size());
      const Action& a = actions[next++];
      const bool fwd = x.kind == Interval::forward;
      EXPECT_EQ(fwd, a.op == Op::forward);
      EXPECT_EQ(x.micro, a.micro);
      EXPECT_EQ(x.chunk, a.chunk);
      const double n =
          static_cast<double>(plan.layers_of[si][static_cast<std::size_t>(a.chunk)].size());
      EXPECT_NEAR(x.length, n * (fwd ? fc : bc), 1e-12);
      busy += x.length;
      in_flight += fwd ? 1 : -1;
      peak = std::max(peak, in_flight);
      const auto key = std::make_tuple(fwd, a.micro, plan.virtual_stage(s, a.chunk));
      start[key] = x.start;
      end[key] = clock;
    }
    EXPECT_EQ(next, actions.size()) << "stage " << s << " ran every action";
    EXPECT_NEAR(clock, t.makespan, 1e-9);
    EXPECT_NEAR(busy, t.busy[si], 1e-9);
    EXPECT_NEAR(t.makespan - busy, t.idle[si], 1e-9);
    EXPECT_EQ(static_cast<int>(peak), t.peak_in_flight[si]);
  }
  const int last = static_cast<int>(model_order(plan).size()) - 1;
  for (const auto& [key, begin] : start) {
    const auto [fwd, micro, k] = key;
    if (fwd && k == 0)
      continue;
    const auto dep = fwd ? std::make_tuple(true, micro, k - 1)
                         : std::make_tuple(k == last, micro, k == last ? k : k + 1);
    ASSERT_TRUE(end.count(dep));
    EXPECT_GE(begin, end[dep] - 1e-9) << (fwd ? "F" : "B") << "(" << micro << ", " << k << ")";
  }
  // As soon as possible: a stage idles only until some dependency of the next action is met.
  for (int s = 0; s < plan.stages; ++s) {
    const auto& slots = t.stages[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i + 1 < slots.size(); ++i) {
      if (slots[i].kind != Interval::idle)
        continue;
      const Interval& x = slots[i + 1];
      const bool fwd = x.kind == Interval::forward;
      const int k = plan.virtual_stage(s, x.chunk);
      const auto dep = fwd ? std::make_tuple(true, x.micro, k - 1)
                           : std::make_tuple(k == last, x.micro, k == last ? k : k + 1);
      EXPECT_NEAR(end[dep], x.start, 1e-9) << "stage " << s << " idles without a reason";
    }
  }
}

// The step's length in closed form (docs/pipeline.md), for costs f and b per layer.
double makespan(const PipelinePlan& plan, double f, double b) {
  const int p = plan.stages, m = plan.micro, layers = plan.layers;
  std::size_t most = 0; // layers of the heaviest stage (gpipe) or its chunk count (layered)
  for (const auto& chunks : plan.layers_of)
    most =
        std::max(most, plan.schedule == Schedule::layered ? chunks.size() : chunks.front().size());
  const int n = static_cast<int>(most);
  if (plan.schedule == Schedule::layered)
    return (f + b) * std::max(layers + m - 1, n * m + (layers - 1) % p);
  if (plan.schedule == Schedule::interleaved)
    return (f + b) * (layers / (p * plan.chunks)) * (plan.chunks * m + p - 1);
  return (f + b) * ((m - 1) * n + layers); // gpipe; 1f1b when the stages are even
}

} // namespace

TEST(Schedule, PlansAreWellFormedAndRunToTheEnd) {
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "layered"})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 4, 5, 8, 16})
        for (int v : {1, 2, 3}) {
          const std::string s = schedule;
          if ((s != "interleaved" && v > 1) || (s == "interleaved" && m % p != 0))
            continue;
          for (int layers : {p * v, 2 * p * v, p * v + 1}) {
            if (s == "interleaved" && layers % (p * v) != 0)
              continue;
            SCOPED_TRACE(s + " p" + std::to_string(p) + " m" + std::to_string(m) + " v" +
                         std::to_string(v) + " L" + std::to_string(layers));
            const PipelinePlan plan = make_plan(s, p, m, v, layers);
            expect_well_formed(plan);
            const Timeline t = simulate(plan); // throws if it cannot finish
            expect_timeline(plan, t, 1.0, 2.0);
            // Stages on different ranks hold exactly the sets in flight; one stage with
            // several chunks keeps a slot until the previous chunk has read its gradient.
            for (int st = 0; st < p; ++st) {
              const int held = t.peak_in_flight[static_cast<std::size_t>(st)];
              if (p > 1)
                EXPECT_EQ(plan.slots[static_cast<std::size_t>(st)], held);
              else
                EXPECT_GE(plan.slots[static_cast<std::size_t>(st)], held);
            }
          }
        }
}

// Bubble = idle / busy time of a stage: (p-1)/m for gpipe and 1f1b, (p-1)/(v m) for
// interleaved and for layered with m >= p (v = L/p single-layer chunks).
TEST(Schedule, BubbleFollowsTheClosedForms) {
  for (int p : {2, 3, 4, 8})
    for (int m : {p, 2 * p, 4 * p}) {
      for (const char* s : {"gpipe", "1f1b"}) {
        const Timeline t = simulate(make_plan(s, p, m, 1, 2 * p));
        for (int st = 0; st < p; ++st)
          EXPECT_NEAR(t.bubble(st), (p - 1.0) / m, 1e-12) << s << " p" << p << " m" << m;
      }
      for (int v : {2, 3, 4}) {
        const Timeline t = simulate(make_plan("interleaved", p, m, v, 2 * p * v));
        for (int st = 0; st < p; ++st)
          EXPECT_NEAR(t.bubble(st), (p - 1.0) / (v * m), 1e-12)
              << "interleaved p" << p << " m" << m << " v" << v;
      }
      for (int v : {1, 2, 3}) {
        const Timeline t = simulate(make_plan("layered", p, m, 1, v * p));
        for (int st = 0; st < p; ++st)
          EXPECT_NEAR(t.bubble(st), (p - 1.0) / (v * m), 1e-12)
              << "layered p" << p << " m" << m << " v" << v;
      }
    }
}

// Fewer micro-batches than stages: gpipe and 1f1b keep (p-1)/m, but the layered
// ring is then bounded by one micro-batch's trip through all L layers, and the
// bubble grows to (v (p - m) + m - 1) / (v m).
TEST(Schedule, BubbleWithFewerMicroBatchesThanStages) {
  for (int p : {3, 4, 8})
    for (int m = 1; m < p; ++m) {
      for (const char* s : {"gpipe", "1f1b"}) {
        const Timeline t = simulate(make_plan(s, p, m, 1, p));
        for (int st = 0; st < p; ++st)
          EXPECT_NEAR(t.bubble(st), (p - 1.0) / m, 1e-12) << s << " p" << p << " m" << m;
      }
      for (int v : {1, 2, 3}) {
        const Timeline t = simulate(make_plan("layered", p, m, 1, v * p));
        const double want = (v * (p - m) + m - 1.0) / (v * m);
        for (int st = 0; st < p; ++st)
          EXPECT_NEAR(t.bubble(st), want, 1e-12) << "layered p" << p << " m" << m << " v" << v;
        if (v > 1)
          EXPECT_GT(want, (p - 1.0) / (v * m)) << "worse than with m >= p";
      }
    }
}

// The makespan in closed form for any per-layer costs, uneven layer counts and
// m < p included; 1f1b with uneven stages lies between the two bounds (the
// heaviest stage's work and one micro-batch's trip) and gpipe's makespan.
TEST(Schedule, MakespanFollowsTheClosedForms) {
  for (const auto& [f, b] : {std::pair{1.0, 2.0}, {1.0, 1.0}, {0.5, 3.0}, {2.0, 0.25}})
    for (const char* schedule : {"gpipe", "1f1b", "interleaved", "layered"})
      for (int p = 1; p <= 6; ++p)
        for (int m = 1; m <= 9; ++m)
          for (int v = 1; v <= 3; ++v)
            for (int layers = p; layers <= 3 * p * v + 1; ++layers) {
              const std::string s = schedule;
              if ((s != "interleaved" && v > 1) ||
                  (s == "interleaved" && (m % p != 0 || layers % (p * v) != 0)))
                continue;
              SCOPED_TRACE(s + " p" + std::to_string(p) + " m" + std::to_string(m) + " v" +
                           std::to_string(v) + " L" + std::to_string(layers) + " f" +
                           std::to_string(f) + " b" + std::to_string(b));
              const PipelinePlan plan = make_plan(s, p, m, v, layers);
              const Timeline t = simulate(plan, f, b);
              for (int st = 0; st < p; ++st) {
                std::size_t n = 0;
                for (const auto& chunk : plan.layers_of[static_cast<std::size_t>(st)])
                  n += chunk.size();
                EXPECT_NEAR(t.busy[static_cast<std::size_t>(st)],
                            (f + b) * m * static_cast<double>(n), 1e-9);
              }
              if (s == "1f1b" && layers % p != 0) {
                const double heaviest = (f + b) * m * ((layers + p - 1) / p);
                EXPECT_GE(t.makespan, std::max(heaviest, (f + b) * layers) - 1e-9);
                EXPECT_LE(t.makespan, makespan(make_plan("gpipe", p, m, 1, layers), f, b) + 1e-9);
              } else {
                EXPECT_NEAR(t.makespan, makespan(plan, f, b), 1e-9);
              }
            }
}

// Activation sets held at once: 1f1b stage s holds min(p - s, m) <= p; gpipe m;
// interleaved Megatron's warm-up count + 1 (at most m v); layered m times the
// stage's chunks, whatever the timing.
TEST(Schedule, PeakInFlightActivationSets) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, p, 3 * p})
      for (int layers : {p, 2 * p, 2 * p + 1}) {
        const Timeline f = simulate(make_plan("1f1b", p, m, 1, layers));
        const Timeline g = simulate(make_plan("gpipe", p, m, 1, layers));
        const PipelinePlan yp = make_plan("layered", p, m, 1, layers);
        const Timeline y = simulate(yp);
        for (int s = 0; s < p; ++s) {
          const auto si = static_cast<std::size_t>(s);
          EXPECT_EQ(f.peak_in_flight[si], std::min(p - s, m));
          EXPECT_LE(f.peak_in_flight[si], p);
          EXPECT_EQ(g.peak_in_flight[si], m);
          EXPECT_EQ(y.peak_in_flight[si], m * static_cast<int>(yp.layers_of[si].size()));
        }
        if (m % p != 0)
          continue;
        for (int v : {1, 2, 3, 4}) {
          const Timeline t = simulate(make_plan("interleaved", p, m, v, p * v));
          for (int s = 0; s < p; ++s)
            EXPECT_EQ(t.peak_in_flight[static_cast<std::size_t>(s)],
                      std::min((p - s - 1) * 2 + (v - 1) * p + 1, m * v))
                << "interleaved p" << p << " m" << m << " v" << v << " stage " << s;
        }
      }
}

TEST(Schedule, LayersGoWhereTheScheduleSays) {
  const PipelinePlan g = make_plan("1f1b", 3, 4, 1, 8); // 3 + 3 + 2
  EXPECT_EQ(g.layers_of[0], (std::vector<std::vector<int>>{{0, 1, 2}}));
  EXPECT_EQ(g.layers_of[2], (std::vector<std::vector<int>>{{6, 7}}));
  const PipelinePlan i = make_plan("interleaved", 2, 2, 2, 8);
  EXPECT_EQ(i.layers_of[0], (std::vector<std::vector<int>>{{0, 1}, {4, 5}}));
  EXPECT_EQ(i.layers_of[1], (std::vector<std::vector<int>>{{2, 3}, {6, 7}}));
  EXPECT_TRUE(i.first(0, 0));
  EXPECT_TRUE(i.last(1, 1));
  const PipelinePlan y = make_plan("layered", 3, 2, 1, 7); // round-robin
  EXPECT_EQ(y.layers_of[0], (std::vector<std::vector<int>>{{0}, {3}, {6}}));
  EXPECT_EQ(y.layers_of[2], (std::vector<std::vector<int>>{{2}, {5}}));
  EXPECT_TRUE(y.last(0, 2));
}

// A plan whose orders cannot all finish is an internal error, not a hang: stage 0
// starting with a backward waits for stage 1, which waits for stage 0's forward.
TEST(Schedule, DeadlockedPlanIsRefused) {
  PipelinePlan plan = make_plan("1f1b", 2, 2, 1, 2);
  auto& a = plan.actions[0];
  const auto b =
      std::find_if(a.begin(), a.end(), [](const Action& x) { return x.op == Op::backward; });
  std::rotate(a.begin(), b, b + 1); // B(0) first
  EXPECT_THROW(simulate(plan), InternalError);
}

TEST(Schedule, BadCombinationsNameTheKeyAndTheRule) {
  auto message = [](const char* s, int p, int m, int v, int layers) {
    try {
      make_plan(s, p, m, v, layers);
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective()) << "every rank refuses the same plan";
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("interleaved", 4, 6, 1, 8),
            "parallel.microbatches = 6: schedule = \"interleaved\" needs microbatches divisible "
            "by pipeline_size = 4");
  EXPECT_EQ(message("interleaved", 2, 2, 2, 6),
            "model.layers = 6: schedule = \"interleaved\" needs layers divisible by "
            "pipeline_size x virtual_stages = 2 x 2");
  EXPECT_EQ(message("1f1b", 4, 2, 1, 2),
            "model.layers = 2: every pipeline stage needs a layer (pipeline_size = 4)");
  EXPECT_EQ(message("layered", 3, 2, 1, 2),
            "model.layers = 2: every pipeline stage needs a layer (pipeline_size = 3)");
  EXPECT_EQ(message("gpipe", 2, 2, 2, 4),
            "parallel.virtual_stages = 2: more than one virtual stage needs schedule = "
            "\"interleaved\"");
  EXPECT_EQ(message("layered", 2, 2, 2, 4).rfind("parallel.virtual_stages = 2", 0), 0u);
  EXPECT_EQ(message("1f1b", 0, 2, 1, 4), "parallel.pipeline_size = 0: must be at least 1");
  EXPECT_EQ(message("1f1b", 2, 0, 1, 4), "parallel.microbatches = 0: must be at least 1");
  EXPECT_EQ(message("interleaved", 2, 2, 0, 4), "parallel.virtual_stages = 0: must be at least 1");
  EXPECT_FALSE(parse_schedule("zigzag")) << "a schedule is one of the four names";
  // The same rules, as text for the deck.
  EXPECT_TRUE(check_plan("interleaved", 4, 8, 2, 16).key.empty());
  EXPECT_EQ(check_plan("interleaved", 4, 8, 3, 16).key, "model.layers");
}
