// Context parallelism (parallel.context_size) in layouts of 2, 4, 8 and 16 ranks, alone
// and with tensor (1d, 1d with sequence parallelism, 2d, 3d), pipeline, data and expert
// parallelism, ZeRO-1 and recomputation, dense and MoE models (MoE also under 1d tensor
// parallelism with and without sequence parallelism), against one process
// running the same micro-batches in turn: the same losses over 10 AdamW steps, the same
// gradients, memory estimate = allocation, traffic = the closed form, and a checkpoint
// written under context (and expert) parallelism resumed on one process.

#include "cubelm/cost/deck.hpp"

#include "deck_text.hpp"
#include "layout_checks.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

struct Case {
  int cp, dp, pp;
  const char* mode; // tensor_mode
  int tp;
  bool sp;     // sequence parallelism (1d)
  int experts; // 0: dense; else an MoE layer every second layer, top-2
  int ep;
  const char* schedule;
  int virtual_stages, microbatches, zero;
  const char* recompute;
  int sequences = 2; // per micro-batch
};

std::string describe(const Case& c) {
  return "cp" + std::to_string(c.cp) + " dp" + std::to_string(c.dp) + " pp" + std::to_string(c.pp) +
         " tp=" + c.mode + ":" + std::to_string(c.tp) + (c.sp ? "+sp" : "") +
         (c.experts ? " experts" + std::to_string(c.experts) + " ep" + std::to_string(c.ep) : "") +
         " " + c.schedule + " v" + std::to_string(c.virtual_stages) + " m" +
         std::to_string(c.microbatches) + (c.zero ? " zero" : "") + " recompute=" + c.recompute;
}

Deck deck(const Case& c) {
  // Micro-batches of sequences of 16 tokens: up to 8 chunks of 2.
  DeckText d;
  d.set("model.seq_len", 16).set("model.heads", 4).set("model.layers", 4);
  if (c.experts != 0)
    d.set("model.experts", c.experts)
        .set("model.top_k", 2)
        .set("model.moe_every", 2)
        .set("model.aux_loss", 0.01);
  return d.set("parallel.tensor_mode", c.mode)
      .set("parallel.tensor_size", c.tp)
      .set("parallel.sequence_parallel", c.sp)
      .set("parallel.context_size", c.cp)
      .set("parallel.data_size", c.dp)
      .set("parallel.pipeline_size", c.pp)
      .set("parallel.expert_size", c.ep)
      .set("parallel.schedule", c.schedule)
      .set("parallel.virtual_stages", c.virtual_stages)
      .set("parallel.microbatches", c.microbatches)
      .set("parallel.zero", c.zero)
      .set("parallel.recompute", c.recompute)
      .set("train.global_batch", c.sequences * c.dp * c.microbatches)
      .layout_training(7)
      .deck("context_parallel.toml");
}

// One process running the same micro-batches in turn.
Deck reference(const Case& c) {
  return deck(Case{1, 1, 1, "none", 1, false, c.experts, 1, "1f1b", 1, c.dp * c.microbatches, 0,
                   "none", c.sequences});
}

std::vector<Case> cases() {
  switch (comm::Communicator::world().size()) {
  case 2:
    return {{2, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 0, "none"},
            {2, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 2, 1, "full"},
            {2, 1, 1, "none", 1, false, 4, 2, "1f1b", 1, 1, 0, "none"},
            {2, 1, 1, "none", 1, false, 4, 1, "1f1b", 1, 2, 1, "full"}};
  case 4:
    return {{4, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 0, "none"},
            {2, 2, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 1, "none"},
            {2, 1, 1, "1d", 2, false, 0, 1, "1f1b", 1, 1, 0, "none"},
            {2, 1, 2, "none", 1, false, 0, 1, "interleaved", 2, 2, 0, "full"},
            {2, 2, 1, "none", 1, false, 4, 4, "1f1b", 1, 1, 1, "none"},
            {2, 1, 1, "1d", 2, true, 4, 2, "1f1b", 1, 1, 0, "none"}};
  case 8:
    return {{2, 1, 1, "2d", 4, false, 0, 1, "1f1b", 1, 1, 0, "none"},
            {2, 2, 1, "1d", 2, true, 0, 1, "1f1b", 1, 1, 0, "none"},
            {2, 2, 2, "none", 1, false, 0, 1, "gpipe", 1, 2, 1, "full"},
            {2, 2, 2, "none", 1, false, 4, 4, "1f1b", 1, 2, 1, "none"},
            {8, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 0, "none"},
            {2, 2, 1, "1d", 2, false, 4, 4, "1f1b", 1, 2, 0, "full"},
            {2, 1, 1, "2d", 4, false, 4, 4, "1f1b", 1, 2, 0, "none"}};
  case 16: // the cube (2 x 2 x 2 tensor ranks) twice, dense and MoE; MoE over 1d 2 x cp 2 x dp 4
    return {{2, 1, 1, "3d", 8, false, 0, 1, "1f1b", 1, 1, 0, "none", 4},
            {2, 1, 1, "3d", 8, false, 8, 8, "1f1b", 1, 1, 0, "full", 4},
            {2, 4, 1, "1d", 2, false, 4, 4, "1f1b", 1, 1, 0, "none"}};
  default: // a rank count without cases must not pass quietly
    ADD_FAILURE() << "no cases for " << comm::Communicator::world().size()
                  << " ranks: add them to this table";
    return {};
  }
}

using cubelm::testing::self;

} // namespace

// The single process's losses within 1e-4 relative over 10 AdamW steps (with clipping),
// its load-balancing loss and gradient norm.
TEST(ContextParallel, EveryLayoutTrainsLikeTheSingleProcess) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    cubelm::testing::expect_same_training(deck(c), reference(c), 10);
  }
}

// After one step every gradient element this rank holds (reduced over its replicas)
// equals the single process's element at the same global index within 1e-5 of the
// largest; ZeRO-1 keeps only a shard reduced, so those layouts are left to the losses.
TEST(ContextParallel, GradientsEqualTheSingleProcess) {
  for (const Case& c : cases()) {
    if (c.zero)
      continue;
    SCOPED_TRACE(describe(c));
    cubelm::testing::expect_same_gradients(deck(c), reference(c));
  }
}

TEST(ContextParallel, MemoryPerRankMatchesTheEstimate) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    cubelm::testing::expect_memory_as_estimated(deck(c));
  }
}

// Every group's calls and bytes equal the closed form (the expert exchange's bytes
// depend on the routing: its calls only).
TEST(ContextParallel, TrafficFollowsTheClosedForm) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c));
    const Deck d = deck(c);
    train::Trainer t(d);
    t.step();
    const train::StepMetrics m = t.step();
    cubelm::testing::expect_traffic(m.traffic, cost::traffic_per_step(d, t.grid().coords().pp),
                                    1e-9, {"ep"});
  }
}

// The layout with the most context (then expert) parallelism of this world saves; one
// process resumes with the same losses.
TEST(ContextParallel, CheckpointResumesOnOneProcess) {
  const auto all = cases();
  ASSERT_FALSE(all.empty()) << "test_context_parallel runs at 2, 4, 8 or 16 ranks";
  const Case c = *std::max_element(all.begin(), all.end(), [](const Case& a, const Case& b) {
    return a.cp * 100 + a.ep * 10 + a.zero < b.cp * 100 + b.ep * 10 + b.zero;
  });
  SCOPED_TRACE(describe(c));
  cubelm::testing::expect_resumes_on_one_process(deck(c), reference(c),
                                                 "cubelm_test_context_parallel_", 3, 3);
}

// The same, for a layout with both: experts spread over the context-parallel ranks.
TEST(ContextParallel, ExpertTimesContextCheckpointResumesOnOneProcess) {
  const auto all = cases();
  const auto it =
      std::find_if(all.begin(), all.end(), [](const Case& c) { return c.cp > 1 && c.ep > 1; });
  ASSERT_NE(it, all.end());
  SCOPED_TRACE(describe(*it));
  cubelm::testing::expect_resumes_on_one_process(deck(*it), reference(*it),
                                                 "cubelm_test_context_expert_", 2, 3);
}
