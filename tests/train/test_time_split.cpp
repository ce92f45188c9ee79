// Where a step's time goes: blocking waits are timed by group (comm/wait_time.hpp),
// and a step's compute, idle and communication times add up to its wall-clock time
// on every rank, in the metrics (compute_ms, comm_ms, idle_ms) and the summary.

#include "cubelm/comm/grid.hpp"
#include "cubelm/comm/wait_time.hpp"
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/train/metrics.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

Deck deck(int tp, int pp) {
  return DeckText()
      .set("model.heads", 4)
      .set("model.layers", 4)
      .set("parallel.tensor_mode", "1d")
      .set("parallel.tensor_size", tp)
      .set("parallel.pipeline_size", pp)
      .set("parallel.microbatches", 4)
      .set("train.steps", 3)
      .set("data.synthetic_tokens", 4096)
      .deck("time_split.toml");
}

} // namespace

// The outermost wait counts, for its own group, whatever waits nest inside it.
TEST(WaitTime, OutermostScopeCountsForItsGroup) {
  const char* outer = comm::watchdog::intern("test.outer");
  const char* inner = comm::watchdog::intern("test.inner");
  const double outer0 = comm::wait_time::seconds("test.outer");
  const double inner0 = comm::wait_time::seconds("test.inner");
  {
    const comm::watchdog::Scope a(outer, "wait");
    sleep_ms(40);
    const comm::watchdog::Scope b(inner, "wait");
    sleep_ms(40);
  }
  EXPECT_GE(comm::wait_time::seconds("test.outer") - outer0, 0.075);
  EXPECT_LT(comm::wait_time::seconds("test.outer") - outer0, 5.0);
  EXPECT_EQ(comm::wait_time::seconds("test.inner") - inner0, 0.0);
  EXPECT_EQ(comm::wait_time::seconds("test.never"), 0.0);
}

// A rank that arrives late at a collective: the others' wait is counted for the group.
TEST(WaitTime, LateRankMakesTheOthersWait) {
  const comm::Communicator world = comm::Communicator::world();
  const comm::Group group("test.late", comm::Communicator::duplicate(world.raw()),
                          std::make_shared<comm::TrafficCounters>());
  Kokkos::View<double*, Kokkos::HostSpace> x("x", 4);
  group.all_reduce(HostExecSpace(), x); // every rank present: the next one times the delay
  const double before = comm::wait_time::seconds("test.late");
  if (group.rank() == 0)
    sleep_ms(300);
  group.all_reduce(HostExecSpace(), x);
  const double waited = comm::wait_time::seconds("test.late") - before;
  if (group.rank() == 0 || group.size() == 1)
    EXPECT_LT(waited, 0.25);
  else
    EXPECT_GE(waited, 0.25);
}

// compute + idle + the groups' waits = the step, per rank and so for the means; the
// groups are the grid's but pp, whose waits are idle time.
TEST(TimeSplit, PartsAddUpToTheStep) {
  const int n = cubelm::testing::world_size();
  // Registered at 1, 2 and 4 ranks: 4 heads and 4 layers split that far.
  for (const auto& [tp, pp] : {std::pair<int, int>{n, 1}, {1, n}}) {
    SCOPED_TRACE("tp " + std::to_string(tp) + ", pp " + std::to_string(pp));
    train::Trainer t(deck(tp, pp));
    for (int s = 0; s < 2; ++s) {
      const train::StepMetrics m = t.step();
      const train::TimeSplit& x = m.time;
      double comm_mean = 0;
      for (const auto& [group, spread] : x.comm_ms) {
        EXPECT_NE(group, "pp");
        EXPECT_GE(spread.mean, 0.0);
        EXPECT_GE(spread.max, spread.mean - 1e-9);
        comm_mean += spread.mean;
      }
      EXPECT_NEAR(x.compute_ms.mean + x.idle_ms.mean + comm_mean, x.ms.mean, 1e-6 * x.ms.mean);
      EXPECT_GT(x.compute_ms.mean, 0.0);
      EXPECT_GE(x.ms.max, m.ms - 1e-9);
      std::vector<std::string> expected;
      for (const std::string& g : t.grid().group_names())
        if (g != "pp")
          expected.push_back(g);
      ASSERT_EQ(x.comm_ms.size(), expected.size());
      for (std::size_t i = 0; i < expected.size(); ++i)
        EXPECT_EQ(x.comm_ms[i].first, expected[i]);
      if (pp == 1)
        EXPECT_EQ(x.idle_ms.max, 0.0);
      const std::string json = train::format_json(m);
      for (const char* key : {"\"compute_ms\": {\"mean\": ", "\"comm_ms\": {\"world\": {\"mean\": ",
                              "\"idle_ms\": {\"mean\": ", "\"step_ms\": {\"mean\": "})
        EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
    }
  }
}

TEST(TimeSplit, SummaryAndEta) {
  train::TimeSplit a, sum;
  a.ms = {10, 12};
  a.compute_ms = {6, 8};
  a.idle_ms = {1, 2};
  a.comm_ms = {{"world", {0.5, 1}}, {"tp", {2.5, 3}}, {"dp", {0, 0}}};
  train::accumulate(sum, a);
  train::accumulate(sum, a);
  EXPECT_DOUBLE_EQ(sum.ms.mean, 20);
  EXPECT_DOUBLE_EQ(sum.comm_ms[1].second.max, 6);
  const std::string text = train::format_time_split(sum, 2);
  EXPECT_NE(text.find("compute"), std::string::npos) << text;
  EXPECT_NE(text.find("60.0%"), std::string::npos) << text; // compute: 6 of 10 ms
  EXPECT_NE(text.find("comm tp"), std::string::npos) << text;
  EXPECT_EQ(text.find("comm dp"), std::string::npos) << "a group without waits is left out";
  EXPECT_EQ(train::format_duration(42), "42s");
  EXPECT_EQ(train::format_duration(185), "3m05s");
  EXPECT_EQ(train::format_duration(7625), "2h07m");
  train::StepMetrics m;
  EXPECT_NE(train::format_step(m, 10, 65).find("| ETA 1m05s"), std::string::npos);
  EXPECT_EQ(train::format_step(m, 10).find("ETA"), std::string::npos);
}
