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
#include "layouts.hpp"
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

// A layout: its deck's [parallel] lines (tests/layouts.hpp).
using Case = std::string;

std::string describe(const Case& c) {
  return cubelm::testing::describe({0, c, {}});
}

// Four sequences per micro-batch (2D and 3D split them over the group).
Deck deck(const Case& c, int layers = 4) {
  DeckText d;
  d.set("model.heads", 4).set("model.layers", layers).lines("parallel", c);
  const int sequences = 4 * d.get("parallel.data_size", 1) * d.get("parallel.microbatches", 1);
  return d.set("train.global_batch", sequences).layout_training(5).deck("pipeline.toml");
}

// The reference: one process, the whole global batch of `c` as one micro-batch.
Deck single(const Case& c, int layers = 4) {
  Deck ref = deck("", layers);
  ref.train.global_batch = deck(c, layers).train.global_batch;
  return ref;
}

// The layouts of the whole world the tests run; a rank count without cases must not pass
// quietly.
std::vector<Case> cases() {
  std::vector<Case> out;
  for (const cubelm::testing::LayoutCase& c : cubelm::testing::required_cases("pipeline"))
    out.push_back(c.parallel);
  return out;
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
    train::Trainer one(single(c), self());
    for (int s = 0; s < 10; ++s) {
      const auto a = group.step(), b = one.step();
      EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << "step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << "step " << s;
    }
  }
}

// Under bf16 the pipeline's messages are the bf16 activations themselves (no rounding on
// the way): every layout trains like the single bf16 process, the loss within 1e-3 and the
// gradient norm within 1e-2 over 3 steps. Later steps drift apart where tensor parallelism
// rounds partial sums (the gradient norm 3% apart by step 5 in 1D on 2 ranks with 2
// stages): each update moves weights whose bf16 copies then round differently.
TEST(Pipeline, Bf16EveryLayoutTrainsLikeTheSingleBf16Process) {
  using cubelm::testing::with_precision;
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    train::Trainer group(with_precision(deck(c), Precision::bf16));
    train::Trainer one(with_precision(single(c), Precision::bf16), self());
    for (int s = 0; s < 3; ++s) {
      const auto a = group.step(), b = one.step();
      EXPECT_NEAR(a.loss, b.loss, 1e-3 * b.loss) << "step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-2 * b.grad_norm) << "step " << s;
    }
  }
}

// Messages too large for MPI's eager protocol (a send completes only when the
// receiver takes it): interleaved over every rank must not wait on itself.
TEST(Pipeline, LargeMessagesDoNotDeadlock) {
  const int p = comm::Communicator::world().size();
  const Case c =
      "pipeline_size = " + std::to_string(p) +
      "\nschedule = \"interleaved\"\nvirtual_stages = 2\nmicrobatches = " + std::to_string(2 * p);
  SCOPED_TRACE(describe(c));
  auto big = [&](Deck d) {
    d.model.hidden = 64;
    d.model.seq_len = 32;
    return d;
  };
  train::Trainer group(big(deck(c, 4 * p)));
  train::Trainer one(big(single(c, 4 * p)), self());
  for (int s = 0; s < 2; ++s) {
    const auto a = group.step(), b = one.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << "step " << s;
  }
}

// Small buckets: one per layer (and ln_f, wpe, and wte alone), each reduced as soon
// as the layered backward pass has finished that layer; the same losses.
TEST(Pipeline, PerLayerBucketsReduceAsLayersFinish) {
  const int d = comm::Communicator::world().size();
  const Case c =
      "data_size = " + std::to_string(d) + "\nschedule = \"layered\"\nmicrobatches = 2\nzero = 1";
  SCOPED_TRACE(describe(c));
  Deck small = deck(c);
  small.parallel.bucket_mb = 1e-6;
  train::Trainer group(small);
  EXPECT_EQ(group.data_parallel().buckets(), small.model.layers + 3);
  train::Trainer one(single(c), self());
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
    if (deck(c).parallel.pipeline_size == 1)
      continue;
    SCOPED_TRACE(describe(c));
    train::Trainer t(deck(c));
    const int stage = t.grid().coords().pp;
    EXPECT_EQ(t.model().stage().slots,
              t.timeline().peak_in_flight[static_cast<std::size_t>(stage)]);
  }
}

// The estimate `cubelm check` prints equals what the ranks of each stage allocate
// (under ZeRO up to the padding of each gradient bucket to a multiple of dp), in fp32
// and under bf16.
TEST(Pipeline, MemoryPerRankMatchesTheEstimate) {
  for (const Case& c : cases())
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(describe(c) + ", " + precision_name(precision));
      const Deck d = cubelm::testing::with_precision(deck(c), precision);
      train::Trainer t(d);
      const cost::Memory measured = t.memory();
      const cost::Memory estimate = cubelm::testing::expect_model_memory_as_estimated(t, d);
      const int dp = d.parallel.data_size;
      const std::int64_t padding = d.parallel.zero ? 12 * t.data_parallel().buckets() * dp : 0;
      EXPECT_LE(estimate.optimizer, measured.optimizer);
      EXPECT_LE(measured.optimizer, estimate.optimizer + padding);
      if (d.parallel.zero) // a 1/dp shard of the moments, and the gradient pieces
        EXPECT_LE(measured.optimizer, 3 * (measured.parameters / dp) + padding);
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
    train::Trainer one(single(c), self());
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
    const Deck ref = single(c);
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
  for (const Case& c : cases())
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(describe(c) + ", " + precision_name(precision));
      const Deck d = cubelm::testing::with_precision(deck(c), precision);
      train::Trainer t(d);
      t.step();
      const train::StepMetrics m = t.step(); // a steady-state step
      const double total = cubelm::testing::expect_traffic(
          m.traffic, cost::traffic_per_step(d, t.grid().coords().pp));
      EXPECT_NEAR(m.comm_bytes, total, 1e-9 * total + 1e-9);
      EXPECT_NEAR(cost::comm_bytes_per_step(d, t.grid().coords().pp), total, 1e-9 * total);
    }
}
