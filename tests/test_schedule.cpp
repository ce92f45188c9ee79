// Pipeline plans and their unit-cost timelines: every action once and in order,
// every layer on one stage, and the bubble and in-flight counts of the closed
// forms (Narayanan et al. 2021; Lamy-Poirier 2021).

#include "cubelm/core/error.hpp"
#include "cubelm/train/schedule.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

using namespace cubelm;
using namespace cubelm::train;

namespace {

// Each (micro, chunk) forward once and backward once, after its forward; slots
// never shared by two live sets; each chunk's last backward marked.
void expect_well_formed(const PipelinePlan& plan) {
  std::set<int> layers;
  for (int s = 0; s < plan.stages; ++s) {
    const auto& chunks = plan.layers_of[static_cast<std::size_t>(s)];
    for (const auto& c : chunks)
      for (int l : c)
        EXPECT_TRUE(layers.insert(l).second) << "layer " << l << " twice";
    std::set<std::pair<int, int>> fwd, bwd;
    std::set<int> live;
    std::vector<int> last(chunks.size(), -1);
    const auto& actions = plan.actions[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      const std::pair<int, int> key{a.micro, a.chunk};
      if (a.op == Op::forward) {
        EXPECT_TRUE(fwd.insert(key).second);
        EXPECT_TRUE(live.insert(a.slot).second) << "slot " << a.slot << " in use";
      } else {
        EXPECT_TRUE(fwd.count(key)) << "backward before forward";
        EXPECT_TRUE(bwd.insert(key).second);
        live.erase(a.slot);
        last[static_cast<std::size_t>(a.chunk)] = static_cast<int>(i);
      }
    }
    EXPECT_EQ(fwd.size(), static_cast<std::size_t>(plan.micro) * chunks.size());
    EXPECT_EQ(bwd.size(), fwd.size());
    for (std::size_t i = 0; i < actions.size(); ++i)
      if (actions[i].op == Op::backward)
        EXPECT_EQ(actions[i].last_backward,
                  static_cast<int>(i) == last[static_cast<std::size_t>(actions[i].chunk)]);
  }
  EXPECT_EQ(layers.size(), static_cast<std::size_t>(plan.layers));
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
            for (int st = 0; st < p; ++st)
              EXPECT_EQ(plan.slots[static_cast<std::size_t>(st)],
                        t.peak_in_flight[static_cast<std::size_t>(st)]);
          }
        }
}

// Bubble = idle / busy time of a stage: (p-1)/m for gpipe and 1f1b, (p-1)/(v m) for
// interleaved and for layered with m >= p (v = L/p single-layer chunks).
TEST(Schedule, BubbleFollowsTheClosedForms) {
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p, 4 * p}) {
      for (const char* s : {"gpipe", "1f1b"}) {
        const Timeline t = simulate(make_plan(s, p, m, 1, 2 * p));
        for (int st = 0; st < p; ++st)
          EXPECT_NEAR(t.bubble(st), (p - 1.0) / m, 1e-12) << s << " p" << p << " m" << m;
      }
      for (int v : {2, 4}) {
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

// Activation sets held at once: 1f1b stage s holds min(p - s, m) <= p; gpipe m;
// interleaved Megatron's warm-up count + 1; layered m v.
TEST(Schedule, PeakInFlightActivationSets) {
  for (int p : {2, 4, 8})
    for (int m : {1, p, 3 * p}) {
      const Timeline f = simulate(make_plan("1f1b", p, m, 1, p));
      const Timeline g = simulate(make_plan("gpipe", p, m, 1, p));
      const Timeline y = simulate(make_plan("layered", p, m, 1, 2 * p));
      for (int s = 0; s < p; ++s) {
        const auto si = static_cast<std::size_t>(s);
        EXPECT_EQ(f.peak_in_flight[si], std::min(p - s, m));
        EXPECT_LE(f.peak_in_flight[si], p);
        EXPECT_EQ(g.peak_in_flight[si], m);
        EXPECT_EQ(y.peak_in_flight[si], 2 * m);
      }
      if (m % p != 0)
        continue;
      const int v = 2;
      const Timeline t = simulate(make_plan("interleaved", p, m, v, p * v));
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(t.peak_in_flight[static_cast<std::size_t>(s)],
                  std::min((p - s - 1) * 2 + (v - 1) * p + 1, m * v));
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

TEST(Schedule, BadCombinationsNameTheKeyAndTheRule) {
  auto message = [](const char* s, int p, int m, int v, int layers) {
    try {
      make_plan(s, p, m, v, layers);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("interleaved", 4, 6, 1, 8).find("parallel.microbatches = 6"),
            std::string::npos);
  EXPECT_NE(message("interleaved", 2, 2, 2, 6).find("model.layers = 6"), std::string::npos);
  EXPECT_NE(message("1f1b", 4, 2, 1, 2).find("every pipeline stage needs a layer"),
            std::string::npos);
  EXPECT_NE(message("gpipe", 2, 2, 2, 4).find("parallel.virtual_stages = 2"), std::string::npos);
  EXPECT_NE(message("zigzag", 2, 2, 1, 4).find("parallel.schedule"), std::string::npos);
}
