// The planner (docs/planner.md) against what runs: every layout it lists for the tiny
// model on this job's ranks trains, and each rank counts exactly the bytes the planner
// predicts for its stage, allocates exactly the memory it predicts, and the planner's
// bubble is the schedule's unit-cost timeline. Its pieces against independent
// computations: the timed timeline (pipeline::simulate, a closed form with message delays),
// group placement on nodes, the alpha-beta cost, machine files. Predicted step times
// against measured ones on a calibrated machine file are reported, not asserted tightly.

#include "cubelm/app/plan.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/planner.hpp"
#include "cubelm/cost/predict.hpp"
#include "cubelm/io/machine.hpp"
#include "cubelm/pipeline/timed.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layout_checks.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

using namespace cubelm;
using cubelm::testing::DeckText;
using cubelm::testing::world_size;

namespace {

// tests/decks/plan_tiny.toml (the CLI tests read that file).
Deck tiny() {
  return DeckText()
      .set("model.heads", 4)
      .set("model.layers", 4)
      .set("train.steps", 3)
      .set("data.synthetic_tokens", 5000)
      .deck("plan_tiny.toml");
}

const char* const kMachine = R"(# a test machine
[machine]
name = "test"
devices_per_node = 4
memory_gib = 2
memory_gbs = 10
gemm_efficiency = 0.5

[peak_tflops]
fp32 = 1
tf32 = 2
bf16 = 4

[network.intra_node]
bandwidth_gbs = 8
latency_us = 2

[network.inter_node]
bandwidth_gbs = 4
latency_us = 20
)";

// The deck's [parallel] keys as deck text, read back by the deck reader.
std::string parallel_text(const Deck& d) {
  const ParallelConfig& p = d.parallel;
  return std::string("[parallel]\ntensor_mode = \"") + mode_name(p.tensor_mode) +
         "\"\ntensor_size = " + std::to_string(p.tensor_size) +
         "\npipeline_size = " + std::to_string(p.pipeline_size) +
         "\ndata_size = " + std::to_string(p.data_size) + "\nschedule = \"" +
         schedule_name(p.schedule) + "\"\nvirtual_stages = " + std::to_string(p.virtual_stages) +
         "\nmicrobatches = " + std::to_string(p.microbatches) +
         "\nzero = " + std::to_string(p.zero) +
         "\nsequence_parallel = " + (p.sequence_parallel ? "true" : "false") + "\nrecompute = \"" +
         recompute_name(p.recompute) + "\"\ncontext_size = " + std::to_string(p.context_size) +
         "\n";
}

std::string model_text() {
  return "[model]\nvocab_size = 32\nseq_len = 8\nhidden = 16\nheads = 4\nlayers = 4\n"
         "[train]\nglobal_batch = 8\n";
}

} // namespace

// Runs `d` for two steps: the second step's counters, the allocation and the unit-cost
// timeline equal the prediction exactly; with `routed` (expert parallelism) the expert
// exchange's bytes, which follow the routing, are left out (its calls are exact).
static void expect_as_predicted(const Deck& d, const io::Machine& machine, bool routed = false) {
  SCOPED_TRACE(cost::layout_line(d));
  const cost::Prediction p = cost::predict(d, machine);
  train::Trainer t(d);
  t.step();
  const train::StepMetrics m = t.step();
  const int stage = t.grid().coords().pp;
  const double total = cubelm::testing::expect_traffic(
      m.traffic, p.stage_traffic.at(static_cast<std::size_t>(stage)), 1e-12,
      routed ? std::vector<std::string>{"ep"} : std::vector<std::string>{});
  if (!routed) {
    EXPECT_NEAR(m.comm_bytes, total, 1e-12 * total);
    if (stage == 0)
      EXPECT_NEAR(m.comm_bytes, p.comm_bytes, 1e-12 * p.comm_bytes);
  }
  // Memory: every kind, exactly, ZeRO-1's padded buckets included.
  const cost::Memory held = t.memory();
  const cost::Memory& predicted = p.stage_memory.at(static_cast<std::size_t>(stage));
  EXPECT_EQ(held.parameters, predicted.parameters);
  EXPECT_EQ(held.gradients, predicted.gradients);
  EXPECT_EQ(held.optimizer, predicted.optimizer);
  EXPECT_EQ(held.activations, predicted.activations);
  EXPECT_EQ(m.mem_bytes, static_cast<double>(predicted.total()));
  // The bubble: the running trainer's unit-cost timeline, every stage.
  ASSERT_EQ(p.unit_bubble.size(), t.timeline().busy.size());
  for (std::size_t s = 0; s < p.unit_bubble.size(); ++s)
    EXPECT_EQ(p.unit_bubble[s], t.timeline().bubble(static_cast<int>(s))) << "stage " << s;
}

// Item 4 of the planner: every layout of the tiny model on this job's ranks, run for two
// steps; the second step's counters, the allocation and the unit-cost timeline equal the
// prediction exactly.
TEST(Planner, EveryLayoutCountsAllocatesAndIdlesAsPredicted) {
  const io::Machine machine = io::parse_machine(kMachine, "test.toml");
  const std::vector<Deck> all = cost::layouts(tiny(), world_size());
  ASSERT_FALSE(all.empty());
  int checked = 0;
  for (const Deck& d : all) {
    expect_as_predicted(d, machine);
    ++checked;
  }
  if (comm::Communicator::world().rank() == 0)
    std::printf("[ planner  ] %d layouts of the tiny model at %d ranks: bytes, memory and "
                "bubble as predicted\n",
                checked, world_size());
}

// With --context-size the planner lays out context-parallel layouts too; those of this
// job (one of each tensor mode and size, pipeline size and ZeRO setting: the rest vary as
// above) count, allocate and idle as predicted.
TEST(Planner, ContextParallelLayoutsAsPredicted) {
  const io::Machine machine = io::parse_machine(kMachine, "test.toml");
  cost::SearchSpace space;
  space.context_sizes = {2};
  const std::vector<Deck> all = cost::layouts(tiny(), world_size(), space);
  if (world_size() == 1) {
    EXPECT_TRUE(all.empty()); // cp = 2 needs two ranks
    return;
  }
  ASSERT_FALSE(all.empty());
  std::set<std::string> grids;
  for (const Deck& d : all) {
    EXPECT_EQ(d.parallel.context_size, 2);
    const std::string key =
        comm::layout_of(d.parallel).describe() + std::to_string(d.parallel.zero);
    if (d.train.precision == Precision::fp32 && grids.insert(key).second)
      expect_as_predicted(d, machine);
  }
}

// MoE models: the planner's layouts (one of each grid and ZeRO setting), the experts
// folded with the tensor ranks into ep or split over them (expert tensor parallelism), in
// every tensor mode, count, allocate and idle as predicted.
TEST(Planner, MoELayoutsAsPredicted) {
  const io::Machine machine = io::parse_machine(kMachine, "test.toml");
  std::set<std::string> modes;
  for (const bool split : {false, true}) {
    Deck base = tiny();
    base.model.experts = 4;
    base.model.top_k = 2;
    base.model.moe_every = 2;
    base.parallel.expert_size = split ? 1 : std::min(world_size(), 4);
    base.parallel.expert_tensor_size = split ? 2 : 1; // > 1: split wherever tp > 1
    std::set<std::string> grids;
    for (const Deck& d : cost::layouts(base, world_size())) {
      const std::string key =
          comm::layout_of(d.parallel).describe() + std::to_string(d.parallel.zero);
      if (d.train.precision != Precision::fp32 || !grids.insert(key).second)
        continue;
      EXPECT_TRUE(d.parallel.expert_tensor_size == 1 ||
                  d.parallel.expert_tensor_size == d.parallel.tensor_size);
      modes.insert(comm::layout_of(d.parallel).describe().substr(0, 5) +
                   (d.parallel.expert_tensor_size > 1 ? " etp" : ""));
      expect_as_predicted(d, machine, d.parallel.expert_size > 1);
    }
  }
  // 2d at 4 ranks and 3d at 8, with and without expert tensor parallelism.
  if (world_size() >= 4)
    EXPECT_TRUE(modes.count("tp=2d") && modes.count("tp=2d etp")) << modes.size();
  if (world_size() == 8)
    EXPECT_TRUE(modes.count("tp=3d etp")) << modes.size();
}

// Every layout the planner lists is a deck `cubelm train` accepts (the deck reader's
// rules, applied to the layout written out as deck text), none twice; and the spaces it
// must cover are there.
// Equal step times rank the layout that needs less memory first (it leaves room).
TEST(Planner, TiesGoToTheSmallerMemory) {
  cost::Prediction fast, lean, heavy;
  fast.step_s = 1.0;
  fast.memory.parameters = 100;
  lean.step_s = 2.0;
  lean.memory.parameters = 11;
  heavy.step_s = 2.0;
  heavy.memory.parameters = 61;
  EXPECT_TRUE(cost::ranks_before(fast, lean));
  EXPECT_TRUE(cost::ranks_before(lean, heavy));
  EXPECT_FALSE(cost::ranks_before(heavy, lean));
  EXPECT_FALSE(cost::ranks_before(lean, lean));
}

TEST(Planner, LayoutsAreValidDecksAndCoverTheSpace) {
  for (const int ranks : {1, 2, 4, 8}) {
    std::set<std::string> seen;
    cost::SearchSpace space;
    space.context_sizes = {1, 2};
    for (const Deck& d : cost::layouts(tiny(), ranks, space)) {
      const std::string text = model_text() + parallel_text(d);
      EXPECT_NO_THROW(cost::parse_deck(text, "layout.toml")) << text;
      EXPECT_EQ(comm::layout_of(d.parallel).world_size(), ranks);
      EXPECT_TRUE(seen.insert(cost::layout_line(d)).second) << cost::layout_line(d);
    }
    if (ranks == 8)
      for (const char* must : {"tp=3d:8 pp=1 dp=1 1f1b m=2 zero=0 recompute=full fp32",
                               "tp=2d:4 pp=2 dp=1 interleaved:2 m=2 zero=0 recompute=none fp32",
                               "tp=1d:4+sp pp=1 dp=2 layered m=2 zero=1 recompute=none fp32",
                               "tp=none:1 pp=4 dp=2 gpipe m=4 zero=1 recompute=full fp32",
                               "tp=1d:2 pp=2 dp=1 cp=2 1f1b m=2 zero=1 recompute=none fp32"})
        EXPECT_EQ(seen.count(must), 1u) << must;
  }
  try {
    cost::layouts(tiny(), 0);
    ADD_FAILURE() << "--ranks 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ranks = 0"), std::string::npos) << e.what();
  }
}

// pipeline::simulate is the timed timeline with unit costs, its idle gaps filled in: each
// stage's intervals tile [0, makespan] and its passes add up to the timed busy time. With
// message delays d, gpipe with one layer per stage takes (m + p - 1)(f + b) + 2 (p - 1) d.
TEST(Planner, TimedTimelineIsTheUnitCostTimelineAndAddsDelays) {
  for (const Schedule schedule :
       {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::layered})
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 8; ++m)
        for (const int v : {1, 2}) {
          const int layers = 8;
          if (!pipeline::check_plan(schedule, p, m, v, layers).key.empty())
            continue;
          const pipeline::PipelinePlan plan = pipeline::make_plan(schedule, p, m, v, layers);
          for (const auto& [f, b] : {std::pair<double, double>{1, 2}, {1, 3}, {2, 5}}) {
            const pipeline::Timeline unit = pipeline::simulate(plan, f, b);
            const pipeline::TimedTimeline timed =
                pipeline::simulate_timed(plan, pipeline::unit_costs(plan, f, b));
            EXPECT_EQ(unit.makespan, timed.makespan);
            for (std::size_t s = 0; s < unit.stages.size(); ++s) {
              double at = 0, busy = 0;
              for (const pipeline::Interval& i : unit.stages[s]) {
                EXPECT_EQ(i.start, at) << "stage " << s << ": a gap or an overlap";
                at = i.start + i.length;
                busy += i.kind == pipeline::Interval::idle ? 0 : i.length;
              }
              EXPECT_EQ(at, unit.makespan);
              EXPECT_EQ(busy, timed.busy[s]);
            }
          }
        }
  for (int p = 2; p <= 4; ++p)
    for (int m = 1; m <= 6; ++m) {
      const pipeline::PipelinePlan plan = pipeline::make_plan(Schedule::gpipe, p, m, 1, p);
      pipeline::PassCosts c = pipeline::unit_costs(plan, 1.5, 2.5);
      c.to_next.assign(static_cast<std::size_t>(p), 0.25);
      c.to_prev.assign(static_cast<std::size_t>(p), 0.25);
      EXPECT_DOUBLE_EQ(pipeline::simulate_timed(plan, c).makespan,
                       (m + p - 1) * (1.5 + 2.5) + 2 * (p - 1) * 0.25)
          << "p " << p << " m " << m;
    }
}

// Groups on nodes, worked out by hand from the rank order (tp fastest, then dp, then pp).
TEST(Planner, GroupsSpanTheNodesTheGridPutsThemOn) {
  // 1D tp = 8 on nodes of 8, dp = 4: tp inside a node; every dp group crosses nodes and
  // the 8 of them leave each node together.
  auto g = cost::place_groups(comm::Layout{4, 1, 8, TensorMode::d1}, 8);
  EXPECT_FALSE(g.at("tp").inter);
  EXPECT_EQ(g.at("tp").ranks, 8);
  EXPECT_TRUE(g.at("dp").inter);
  EXPECT_EQ(g.at("dp").sharing, 8);
  EXPECT_EQ(g.at("dp").ranks, 4);
  // 3D 4x4x4 on nodes of 4: a node holds one (b, c) line of a.
  g = cost::place_groups(comm::Layout{1, 1, 64, TensorMode::d3}, 4);
  EXPECT_FALSE(g.at("tp.a").inter);
  EXPECT_TRUE(g.at("tp.b").inter);
  EXPECT_EQ(g.at("tp.b").sharing, 4);
  EXPECT_TRUE(g.at("tp.c").inter);
  EXPECT_EQ(g.at("tp.c").sharing, 4);
  EXPECT_EQ(g.at("tp.ab").sharing, 1); // the node's ranks are all in one AB plane
  EXPECT_EQ(g.at("tp.ca").sharing, 1);
  EXPECT_EQ(g.at("tp.bc").sharing, 4); // and in four BC planes
  EXPECT_EQ(g.at("tp.bc").ranks, 16);
  // 2D 8x8 on nodes of 4: half a row per node; four columns leave each node.
  g = cost::place_groups(comm::Layout{1, 1, 64, TensorMode::d2}, 4);
  EXPECT_TRUE(g.at("tp.row").inter);
  EXPECT_EQ(g.at("tp.row").sharing, 1);
  EXPECT_EQ(g.at("tp.col").sharing, 4);
  // Pipeline of 4 stages of 2 ranks on nodes of 4: stage 1 -> 2 and 3 -> 0 cross nodes.
  g = cost::place_groups(comm::Layout{1, 4, 2, TensorMode::d1}, 4);
  EXPECT_FALSE(g.at("pp>0").inter);
  EXPECT_TRUE(g.at("pp>1").inter);
  EXPECT_EQ(g.at("pp>1").sharing, 2);
  EXPECT_FALSE(g.at("pp>2").inter);
  EXPECT_TRUE(g.at("pp>3").inter);
  EXPECT_TRUE(g.at("pp.ends").inter);
}

// The alpha-beta cost: bytes over the level's bandwidth plus a latency per step.
TEST(Planner, CollectiveCostIsAlphaBeta) {
  const io::Machine m = io::parse_machine(kMachine, "test.toml");
  const cost::GroupPlacement inside{8, false, 1}, across{8, true, 4};
  EXPECT_DOUBLE_EQ(cost::collective_seconds(comm::Kind::all_reduce, inside, 3, 8e9, m),
                   1.0 + 3 * 2 * 3 * 2e-6); // 8 GB/s; 2 log2 8 steps of 2 us per call
  EXPECT_DOUBLE_EQ(cost::collective_seconds(comm::Kind::all_gather, across, 2, 1e9, m),
                   1.0 + 2 * 7 * 20e-6); // 4 GB/s per node shared by 4 groups
  EXPECT_DOUBLE_EQ(
      cost::collective_seconds(comm::Kind::send, cost::GroupPlacement{2, true, 1}, 1, 4e9, m),
      1.0 + 20e-6);
}

// Machine files: read back what machine_toml writes; bad values name file, line, key,
// value and rule.
TEST(Planner, MachineFilesRoundTripAndRefuseBadValues) {
  const io::Machine m = io::parse_machine(kMachine, "test.toml");
  const io::Machine again = io::parse_machine(io::machine_toml(m, "# again\n"), "again.toml");
  EXPECT_EQ(again.name, "test");
  EXPECT_EQ(again.devices_per_node, 4);
  EXPECT_EQ(again.peak_flops(Precision::tf32), 2e12);
  EXPECT_EQ(again.gemm_efficiency, 0.5);
  EXPECT_EQ(again.inter.latency_us, 20);
  const auto refused = [](const std::string& from, const std::string& to) {
    std::string text = kMachine;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    try {
      io::parse_machine(text, "bad.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused("gemm_efficiency = 0.5", "gemm_efficiency = 1.5")
                .find("bad.toml:7: machine.gemm_efficiency = 1.5: must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(refused("devices_per_node = 4", "devices_per_node = 0")
                .find("bad.toml:4: machine.devices_per_node = 0: must be at least 1"),
            std::string::npos);
  EXPECT_NE(refused("latency_us = 20", "latency_us = -1")
                .find("network.inter_node.latency_us = -1: must be at least 0"),
            std::string::npos);
  EXPECT_NE(
      refused("bf16 = 4", "bf16 = \"fast\"").find("peak_tflops.bf16 = \"fast\": must be a number"),
      std::string::npos);
  EXPECT_NE(refused("memory_gbs = 10", "memory_gb = 10").find("unknown key 'machine.memory_gb'"),
            std::string::npos);
  EXPECT_NE(refused("[network.inter_node]", "[network.between]").find("network.between"),
            std::string::npos);
  EXPECT_NE(refused("fp32 = 1", "fp32 = [").find("not valid TOML"), std::string::npos);
  // checkpoint_gbs is optional (0: unknown), written back only when known, and positive.
  EXPECT_EQ(m.checkpoint_gbs, 0);
  EXPECT_EQ(io::machine_toml(m).find("checkpoint_gbs"), std::string::npos);
  EXPECT_NE(refused("gemm_efficiency = 0.5", "gemm_efficiency = 0.5\ncheckpoint_gbs = 0")
                .find("bad.toml:8: machine.checkpoint_gbs = 0: must be positive"),
            std::string::npos);
  std::string with = kMachine;
  with.replace(with.find("gemm_efficiency = 0.5"), 21,
               "gemm_efficiency = 0.5\ncheckpoint_gbs = 2.5");
  const io::Machine fast = io::parse_machine(with, "with.toml");
  EXPECT_EQ(fast.checkpoint_gbs, 2.5);
  EXPECT_EQ(io::parse_machine(io::machine_toml(fast), "again.toml").checkpoint_gbs, 2.5);
}

// A save stops every rank for its size over checkpoint_gbs, spread over the steps between
// saves; without checkpoint_gbs the step time is the training step's alone.
TEST(Planner, CheckpointsAddTheirWriteTimeSpreadOverTheInterval) {
  io::Machine machine = io::parse_machine(kMachine, "test.toml");
  Deck deck = tiny();
  deck.train.steps = 1000;
  const cost::Prediction without = cost::predict(deck, machine);
  EXPECT_EQ(without.checkpoint_s, 0);
  EXPECT_EQ(without.checkpoint_step_s, 0);
  const double bytes = static_cast<double>(cost::checkpoint_bytes(deck.model));
  EXPECT_EQ(without.checkpoint_bytes, bytes);
  // Three float32 copies of every parameter, and a little more (checksums, metadata).
  const double data = 3.0 * 4 * static_cast<double>(cost::parameter_count(deck.model));
  EXPECT_GT(bytes, data);
  EXPECT_LT(bytes, data * 1.5 + 1e6);

  machine.checkpoint_gbs = 0.5;
  const cost::Prediction at_end = cost::predict(deck, machine);
  EXPECT_DOUBLE_EQ(at_end.checkpoint_s, bytes / 0.5e9);
  EXPECT_DOUBLE_EQ(at_end.checkpoint_step_s, at_end.checkpoint_s / 1000);
  EXPECT_DOUBLE_EQ(at_end.step_s, without.step_s + at_end.checkpoint_step_s);
  EXPECT_LT(at_end.mfu, without.mfu);
  deck.checkpoint.interval = 10;
  const cost::Prediction every10 = cost::predict(deck, machine);
  EXPECT_DOUBLE_EQ(every10.checkpoint_step_s, every10.checkpoint_s / 10);
  EXPECT_DOUBLE_EQ(every10.step_s, without.step_s + every10.checkpoint_step_s);
  EXPECT_DOUBLE_EQ(every10.compute_s, without.compute_s);
}

// Every layout gets a finite, positive prediction from a machine calibrated here.
// How close the predictions come to measured steps is a measurement, not a unit
// test's bound: perf/bench_planner reports predicted / measured layout by layout.
TEST(Planner, CalibratedMachinePredictsEveryLayout) {
  std::string report;
  const io::Machine machine = app::measure_machine("", report);
  const std::vector<Deck> all = cost::layouts(tiny(), world_size());
  ASSERT_FALSE(all.empty()) << "no layout for " << world_size() << " ranks";
  for (const Deck& d : all) {
    const cost::Prediction p = cost::predict(d, machine);
    EXPECT_TRUE(std::isfinite(p.step_s) && p.step_s > 0)
        << cost::layout_line(d) << ": predicted step " << p.step_s << " s";
  }
}
