// The numeric guard (docs/reliability.md): a step with a non-finite loss or
// gradient norm is skipped on every rank, leaves parameters and moments bitwise
// as they were, and train.max_bad_steps consecutive skips stop training with a
// collective error. On 2 ranks each layout of two processes is run.

#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;
using cubelm::testing::world_size;

namespace {

// lr = 1e6 without clipping: the tiny model's gradient norm is NaN from step 2 on.
Deck nan_deck(const std::string& parallel, int max_bad_steps, double lr = 1e6) {
  return DeckText()
      .lines("parallel", parallel)
      .set("train.steps", 20)
      .set("train.global_batch", 4)
      .set("train.max_bad_steps", max_bad_steps)
      .set("optimizer.lr", lr)
      .set("optimizer.grad_clip", 0)
      .deck("guard.toml");
}

// The layouts of the job's world size.
std::vector<std::string> layouts() {
  if (world_size() == 2)
    return {"data_size = 2", "data_size = 2\nzero = 1\nmicrobatches = 2",
            "tensor_mode = \"1d\"\ntensor_size = 2", "pipeline_size = 2\nmicrobatches = 2"};
  return {""};
}

// This rank's parameter values and AdamW moments, copied to the host.
std::vector<std::vector<real>> state(train::Trainer& t) {
  std::vector<std::vector<real>> out;
  auto add = [&](const kernels::Vec<real>& v) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    out.emplace_back(h.data(), h.data() + h.extent(0));
  };
  for (const auto& p : t.model().params())
    add(p.value);
  for (int which = 0; which < 2; ++which)
    for (const auto& v : t.data_parallel().moments(which))
      add(v);
  return out;
}

bool bitwise_equal(const std::vector<std::vector<real>>& a,
                   const std::vector<std::vector<real>>& b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].size() != b[k].size() ||
        std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(real)) != 0)
      return false;
  return true;
}

// True when every rank passes the same value.
bool all_ranks_agree(int value) {
  int lo = value, hi = value;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

} // namespace

TEST(Guard, NonFiniteStepsAreSkippedThenTrainingStops) {
  for (const std::string& layout : layouts()) {
    SCOPED_TRACE(layout);
    const int max_bad = 3;
    train::Trainer t(nan_deck(layout, max_bad));
    int first_bad = -1;
    std::string message;
    for (int s = 0; s < 20 && message.empty(); ++s) {
      const auto before = state(t);
      const int updates = t.updates_done();
      train::StepMetrics m;
      try {
        m = t.step();
      } catch (const Error& e) {
        message = e.what();
        EXPECT_TRUE(e.collective());
        EXPECT_TRUE(first_bad >= 0 && s == first_bad + max_bad - 1) << "stopped at step " << s;
        EXPECT_TRUE(bitwise_equal(before, state(t))) << "the stopping step changed the model";
        break;
      }
      EXPECT_EQ(m.step, s);
      EXPECT_EQ(t.steps_done(), s + 1) << "a skipped step still counts";
      ASSERT_TRUE(all_ranks_agree(m.skipped ? 1 : 0)) << "step " << s;
      EXPECT_EQ(m.skipped, !std::isfinite(m.loss) || !std::isfinite(m.grad_norm));
      if (m.skipped) {
        if (first_bad < 0)
          first_bad = s;
        EXPECT_EQ(t.updates_done(), updates);
        EXPECT_EQ(t.bad_steps(), s - first_bad + 1);
        EXPECT_TRUE(bitwise_equal(before, state(t)))
            << "step " << s << ": parameters or moments changed in a skipped step";
      } else {
        EXPECT_LT(first_bad, 0) << "once NaN, the tiny model stays NaN";
        EXPECT_EQ(t.updates_done(), updates + 1);
        EXPECT_FALSE(bitwise_equal(before, state(t)));
      }
    }
    ASSERT_GE(first_bad, 1) << "the deck did not reach a non-finite step";
    const int stop = first_bad + max_bad - 1;
    EXPECT_NE(message.find("step " + std::to_string(stop) + ":"), std::string::npos) << message;
    EXPECT_NE(message.find("train.max_bad_steps = 3"), std::string::npos) << message;
    EXPECT_NE(message.find("before step " + std::to_string(first_bad)), std::string::npos)
        << message;
    EXPECT_TRUE(all_ranks_agree(message.empty() ? 0 : 1)) << "every rank raises the error";
  }
}

TEST(Guard, FiniteRunsSkipNothing) {
  for (const std::string& layout : layouts()) {
    SCOPED_TRACE(layout);
    train::Trainer t(nan_deck(layout, 1, 1e-3));
    for (int s = 0; s < 5; ++s) {
      const auto m = t.step();
      EXPECT_FALSE(m.skipped);
      EXPECT_TRUE(std::isfinite(m.loss) && std::isfinite(m.grad_norm));
    }
    EXPECT_EQ(t.updates_done(), 5);
    EXPECT_EQ(t.bad_steps(), 0);
  }
}

// The AdamW update count travels through a checkpoint: a resumed run corrects
// its bias with the updates applied, not the steps counted.
TEST(Guard, CheckpointKeepsTheUpdateCount) {
  const std::string layout = layouts().front();
  int pid = static_cast<int>(::getpid()); // rank 0's: one file for the job
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("cubelm_test_guard_" + std::to_string(pid) + ".h5"))
                               .string();
  train::Trainer t(nan_deck(layout, 10));
  train::StepMetrics m;
  while (!m.skipped)
    m = t.step();
  t.step();
  EXPECT_EQ(t.bad_steps(), 2);
  EXPECT_EQ(t.updates_done(), t.steps_done() - 2);
  t.save(path);
  train::Trainer u(nan_deck(layout, 10));
  u.resume(path);
  EXPECT_EQ(u.steps_done(), t.steps_done());
  EXPECT_EQ(u.updates_done(), t.updates_done());
  EXPECT_EQ(u.bad_steps(), 0);
  EXPECT_TRUE(bitwise_equal(state(t), state(u)));
  MPI_Barrier(MPI_COMM_WORLD);
  if (t.is_root())
    std::filesystem::remove(path);
}

TEST(Guard, MetricsMarkSkippedSteps) {
  train::StepMetrics m;
  m.step = 4;
  m.loss = 2.5;
  m.grad_norm = NAN;
  EXPECT_EQ(train::format_json(m).find("\"skipped\": true"), std::string::npos);
  EXPECT_NE(train::format_json(m).find("\"skipped\": false"), std::string::npos);
  EXPECT_EQ(train::format_step(m, 10).find("skipped"), std::string::npos);
  m.skipped = true;
  EXPECT_NE(train::format_json(m).find("\"skipped\": true"), std::string::npos);
  EXPECT_NE(train::format_json(m).find("\"grad_norm\": null"), std::string::npos)
      << "JSON has no NaN";
  EXPECT_NE(train::format_step(m, 10).find("| skipped (non-finite gradient norm)"),
            std::string::npos);
  m.loss = INFINITY;
  EXPECT_NE(train::format_step(m, 10).find("| skipped (non-finite loss)"), std::string::npos);
}

// A request to stop made on one rank reaches every rank through the step's reduction,
// in every layout, and changes nothing of the step itself.
TEST(Stop, VotesReachEveryRank) {
  const int rank = comm::Communicator::world().rank();
  for (const std::string& layout : layouts()) {
    SCOPED_TRACE(layout);
    train::Trainer voted(nan_deck(layout, 3, 1e-3)), plain(nan_deck(layout, 3, 1e-3));
    train::StopVotes vote;
    vote.sigusr1 = rank == world_size() - 1;
    vote.deadline = 1;
    voted.vote_stop(vote);
    const train::StepMetrics a = voted.step(), b = plain.step();
    EXPECT_EQ(a.stop.sigusr1, 1);
    EXPECT_EQ(a.stop.sigterm, 0);
    EXPECT_EQ(a.stop.deadline, world_size());
    EXPECT_FALSE(b.stop.any());
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_FALSE(voted.step().stop.any()) << "a vote counts for one step";
  }
}

TEST(Stop, TimeLimitDeckKey) {
  EXPECT_EQ(cost::parse_deck("", "d.toml").train.time_limit_s, 0);
  EXPECT_EQ(cost::parse_deck("[train]\ntime_limit_s = 3600\n", "d.toml").train.time_limit_s, 3600);
  try {
    cost::parse_deck("[train]\ntime_limit_s = -1\n", "d.toml");
    ADD_FAILURE() << "time_limit_s = -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.time_limit_s = -1: must be at least 0"),
              std::string::npos)
        << e.what();
  }
}

// A resumed run writes the steps after its checkpoint again: their old lines go.
TEST(Stop, ResumedMetricsDropRepeatedSteps) {
  const std::string path =
      "stop_metrics_" + std::to_string(comm::Communicator::world().rank()) + ".jsonl";
  {
    std::ofstream out(path);
    for (int s = 0; s < 6; ++s) {
      train::StepMetrics m;
      m.step = s;
      m.loss = s;
      out << train::format_json(m) << "\n";
    }
  }
  train::drop_metrics_from(path, 4);
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line))
    EXPECT_EQ(line.find("{\"step\": " + std::to_string(lines++) + ","), 0u) << line;
  EXPECT_EQ(lines, 4);
  std::remove(path.c_str());
  train::drop_metrics_from(path, 0); // missing: stays missing
  EXPECT_FALSE(std::ifstream(path).good());
}

TEST(Guard, DeckKey) {
  EXPECT_EQ(cost::parse_deck("", "d.toml").train.max_bad_steps, 10);
  EXPECT_EQ(cost::parse_deck("[train]\nmax_bad_steps = 1\n", "d.toml").train.max_bad_steps, 1);
  try {
    cost::parse_deck("[train]\nmax_bad_steps = 0\n", "d.toml");
    ADD_FAILURE() << "max_bad_steps = 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.max_bad_steps = 0: must be at least 1"),
              std::string::npos)
        << e.what();
  }
}
