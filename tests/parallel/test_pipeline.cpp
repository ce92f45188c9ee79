// Pipeline and data parallelism composed with the tensor-parallel modes: every
// schedule and layout the world size fits trains with the single-process
// run's losses (full batch, one micro-batch), a checkpoint written by the most
// parallel layout resumes on one process, and each stage holds the activation
// sets its schedule needs. The messages between stages go in posting order, as
// NCCL needs them (pipeline/messages.hpp).

#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/traffic.hpp"
#include "cubelm/train/pipeline.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layout_checks.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <unistd.h>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

struct Case {
  const char* mode; // tensor_mode
  int tp, pp, dp;
  const char* schedule;
  int virtual_stages, microbatches, zero;
  const char* recompute;
  bool sequence_parallel = false;
};

std::string describe(const Case& c) {
  return std::string(c.mode) + " tp" + std::to_string(c.tp) + " pp" + std::to_string(c.pp) + " dp" +
         std::to_string(c.dp) + " " + c.schedule + " v" + std::to_string(c.virtual_stages) + " m" +
         std::to_string(c.microbatches) + (c.zero ? " zero" : "") + " recompute=" + c.recompute +
         (c.sequence_parallel ? " sp" : "");
}

// Four sequences per micro-batch (2D and 3D split them over the group).
int global_batch(const Case& c) {
  return 4 * c.dp * c.microbatches;
}

Deck deck(const Case& c, int layers = 4) {
  return DeckText()
      .set("model.heads", 4)
      .set("model.layers", layers)
      .set("parallel.tensor_mode", c.mode)
      .set("parallel.tensor_size", c.tp)
      .set("parallel.pipeline_size", c.pp)
      .set("parallel.data_size", c.dp)
      .set("parallel.schedule", c.schedule)
      .set("parallel.virtual_stages", c.virtual_stages)
      .set("parallel.microbatches", c.microbatches)
      .set("parallel.zero", c.zero)
      .set("parallel.sequence_parallel", c.sequence_parallel)
      .set("parallel.recompute", c.recompute)
      .set("train.global_batch", global_batch(c))
      .layout_training(5)
      .deck("pipeline.toml");
}

// The reference: one process, the whole global batch as one micro-batch.
Case single() {
  return Case{"none", 1, 1, 1, "1f1b", 1, 1, 0, "none"};
}

// The layouts of the whole world the tests run.
std::vector<Case> cases() {
  switch (comm::Communicator::world().size()) {
  case 2:
    return {{"none", 1, 2, 1, "gpipe", 1, 4, 0, "none"},
            {"none", 1, 2, 1, "1f1b", 1, 4, 0, "none"},
            {"none", 1, 2, 1, "interleaved", 2, 4, 0, "none"},
            {"none", 1, 2, 1, "layered", 1, 4, 0, "none"},
            {"none", 1, 2, 1, "1f1b", 1, 4, 0, "full"},
            {"none", 1, 1, 2, "1f1b", 1, 2, 0, "none"},
            {"none", 1, 1, 2, "1f1b", 1, 2, 1, "none"},
            {"none", 1, 1, 2, "layered", 1, 3, 1, "full"}};
  case 4:
    return {{"1d", 2, 2, 1, "1f1b", 1, 4, 0, "none"},
            {"1d", 2, 2, 1, "interleaved", 2, 4, 0, "full", true},
            {"1d", 4, 1, 1, "1f1b", 1, 2, 0, "full", true},
            {"none", 1, 2, 2, "interleaved", 2, 2, 1, "none"},
            {"none", 1, 4, 1, "gpipe", 1, 4, 0, "none"},
            {"none", 1, 4, 1, "layered", 1, 5, 0, "full"},
            {"2d", 4, 1, 1, "layered", 1, 2, 0, "none"},
            {"none", 1, 1, 4, "1f1b", 1, 1, 1, "none"}};
  case 8:
    return {{"1d", 2, 2, 2, "1f1b", 1, 2, 1, "none"},
            {"1d", 2, 2, 2, "layered", 1, 2, 1, "none", true},
            {"2d", 4, 2, 1, "1f1b", 1, 2, 0, "none"},
            {"3d", 8, 1, 1, "layered", 1, 2, 0, "full"},
            {"none", 1, 4, 2, "1f1b", 1, 4, 0, "none"},
            {"none", 1, 1, 8, "layered", 1, 2, 1, "none"}};
  default: // a rank count without cases must not pass quietly
    ADD_FAILURE() << "no cases for " << comm::Communicator::world().size()
                  << " ranks: add them to this table";
    return {};
  }
}

using cubelm::testing::self;
using cubelm::testing::temp_path;

} // namespace

// Every schedule and layout: the single-process losses within 1e-4 relative over
// 10 AdamW steps (with clipping), and the same gradient norm.
TEST(Pipeline, EveryLayoutTrainsLikeTheSingleProcess) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    train::Trainer group(deck(c));
    Deck ref = deck(single());
    ref.train.global_batch = global_batch(c);
    train::Trainer one(ref, self());
    for (int s = 0; s < 10; ++s) {
      const auto a = group.step(), b = one.step();
      EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << "step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << "step " << s;
    }
  }
}

// Messages too large for MPI's eager protocol (a send completes only when the
// receiver takes it): interleaved over every rank must not wait on itself.
TEST(Pipeline, LargeMessagesDoNotDeadlock) {
  const int p = comm::Communicator::world().size();
  const Case c{"none", 1, p, 1, "interleaved", 2, 2 * p, 0, "none"};
  SCOPED_TRACE(describe(c));
  auto big = [&](Deck d) {
    d.model.hidden = 64;
    d.model.seq_len = 32;
    return d;
  };
  train::Trainer group(big(deck(c, 4 * p)));
  Deck ref = big(deck(single(), 4 * p));
  ref.train.global_batch = global_batch(c);
  train::Trainer one(ref, self());
  for (int s = 0; s < 2; ++s) {
    const auto a = group.step(), b = one.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << "step " << s;
  }
}

// Small buckets: one per layer (and ln_f, wpe, and wte alone), each reduced as soon
// as the layered backward pass has finished that layer; the same losses.
TEST(Pipeline, PerLayerBucketsReduceAsLayersFinish) {
  const int d = comm::Communicator::world().size();
  const Case c{"none", 1, 1, d, "layered", 1, 2, 1, "none"};
  SCOPED_TRACE(describe(c));
  Deck small = deck(c);
  small.parallel.bucket_mb = 1e-6;
  train::Trainer group(small);
  EXPECT_EQ(group.data_parallel().buckets(), small.model.layers + 3);
  Deck ref = deck(single());
  ref.train.global_batch = global_batch(c);
  train::Trainer one(ref, self());
  for (int s = 0; s < 3; ++s) {
    const auto a = group.step(), b = one.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << "step " << s;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << "step " << s;
  }
}

// Every layout's messages go in posting order, without tags (the order NCCL needs),
// so the runs above had MPI match them that way (comm::Matching::in_order).
TEST(Pipeline, MessagesGoInOrderWithoutTags) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    const Deck d = deck(c);
    const pipeline::PipelinePlan plan = pipeline::make_plan(d.parallel, d.model);
    for (int s = 0; s < plan.stages; ++s)
      EXPECT_TRUE(train::PipelineStage(plan, s).untagged()) << "stage " << s;
  }
}

// With the stages on different ranks, each holds exactly the activation sets the
// schedule's unit-cost timeline has in flight.
TEST(Pipeline, StagesHoldThePeakInFlightActivationSets) {
  for (const Case& c : cases()) {
    if (c.pp == 1)
      continue;
    SCOPED_TRACE(describe(c));
    train::Trainer t(deck(c));
    const int stage = t.grid().coords().pp;
    EXPECT_EQ(t.model().stage().slots,
              t.timeline().peak_in_flight[static_cast<std::size_t>(stage)]);
  }
}

// The estimate `cubelm check` prints equals what the ranks of each stage allocate
// (under ZeRO up to the padding of each gradient bucket to a multiple of dp).
TEST(Pipeline, MemoryPerRankMatchesTheEstimate) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    const Deck d = deck(c);
    train::Trainer t(d);
    const cost::Memory measured = t.memory();
    const cost::Memory estimate = cost::estimate_memory(d, t.grid().coords().pp);
    EXPECT_EQ(measured.parameters, estimate.parameters);
    EXPECT_EQ(measured.gradients, estimate.gradients);
    EXPECT_EQ(measured.activations, estimate.activations);
    const std::int64_t padding = c.zero ? 12 * t.data_parallel().buckets() * c.dp : 0;
    EXPECT_LE(estimate.optimizer, measured.optimizer);
    EXPECT_LE(measured.optimizer, estimate.optimizer + padding);
    if (c.zero) // a 1/dp shard of the moments, and the gradient pieces
      EXPECT_LE(measured.optimizer, 3 * (measured.parameters / c.dp) + padding);
  }
}

// The most parallel layout of this world saves; one process resumes with the same
// losses (the ZeRO shards and the pipeline stages write one layout-free file).
TEST(Pipeline, CheckpointResumesOnOneProcess) {
  const auto all = cases();
  ASSERT_FALSE(all.empty()) << "test_pipeline runs at 2, 4 or 8 ranks";
  const comm::Communicator world = comm::Communicator::world();
  const Case c = all.front();
  SCOPED_TRACE(describe(c));
  const std::string path = temp_path("cubelm_test_pipeline_");
  train::Trainer group(deck(c));
  for (int s = 0; s < 3; ++s)
    group.step();
  group.save(path);
  std::vector<double> losses;
  for (int s = 3; s < 6; ++s)
    losses.push_back(group.step().loss);
  if (world.rank() == 0) {
    Deck ref = deck(single());
    ref.train.global_batch = global_batch(c);
    train::Trainer one(ref, self());
    one.resume(path);
    EXPECT_EQ(one.steps_done(), 3);
    for (int s = 3; s < 6; ++s)
      EXPECT_NEAR(one.step().loss, losses[s - 3], 1e-4 * losses[s - 3]) << "step " << s;
  }
  MPI_Barrier(world.raw());
  if (world.rank() == 0)
    std::filesystem::remove(path);
}

// The other way: one process saves, every layout of this world resumes from the
// file (each ZeRO shard and pipeline stage reads its part) with the losses of the
// process that wrote it.
TEST(Pipeline, EveryLayoutResumesAOneProcessCheckpoint) {
  const comm::Communicator world = comm::Communicator::world();
  const std::string path = temp_path("cubelm_test_pipeline_single_");
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    Deck ref = deck(single());
    ref.train.global_batch = global_batch(c);
    std::vector<double> losses(3, 0.0);
    if (world.rank() == 0) {
      train::Trainer one(ref, self());
      for (int s = 0; s < 2; ++s)
        one.step();
      one.save(path);
      for (auto& l : losses)
        l = one.step().loss;
    }
    MPI_Bcast(losses.data(), 3, MPI_DOUBLE, 0, world.raw());
    train::Trainer group(deck(c));
    group.resume(path);
    EXPECT_EQ(group.steps_done(), 2);
    for (int s = 0; s < 3; ++s)
      EXPECT_NEAR(group.step().loss, losses[s], 1e-4 * losses[s]) << "step " << s + 2;
    MPI_Barrier(world.raw());
  }
  if (world.rank() == 0)
    std::filesystem::remove(path);
}

// The closed form of a step's traffic (cost/traffic.hpp) equals what this rank's
// counters count, group by group, in every layout: pipeline messages, pp.ends, the
// data-parallel buckets with and without ZeRO-1, recomputation, the tensor modes.
TEST(Pipeline, TrafficFollowsTheClosedForm) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    const Deck d = deck(c);
    train::Trainer t(d);
    t.step();
    const train::StepMetrics m = t.step(); // a steady-state step
    const double total =
        cubelm::testing::expect_traffic(m.traffic, cost::traffic_per_step(d, t.grid().coords().pp));
    EXPECT_NEAR(m.comm_bytes, total, 1e-9 * total + 1e-9);
    EXPECT_NEAR(cost::comm_bytes_per_step(d, t.grid().coords().pp), total, 1e-9 * total);
  }
}
