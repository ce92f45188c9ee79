#include "cubelm/cost/deck.hpp"
// Context parallelism (parallel.context_size) in layouts of 2, 4, 8 and 16 ranks, alone
#include "cubelm/cost/deck.hpp"
// and with tensor (1d, 1d with sequence parallelism, 2d, 3d), pipeline, data and expert
#include "cubelm/cost/deck.hpp"
// parallelism, ZeRO-1 and recomputation, dense and MoE models (MoE also under 1d tensor
#include "cubelm/cost/deck.hpp"
// parallelism with and without sequence parallelism), against one process
#include "cubelm/cost/deck.hpp"
// running the same micro-batches in turn: the same losses over 10 AdamW steps, the same
#include "cubelm/cost/deck.hpp"
// gradients, memory estimate = allocation, traffic = the closed form, and a checkpoint
#include "cubelm/cost/deck.hpp"
// written under context (and expert) parallelism resumed on one process.
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
#include "layout_checks.hpp"

#include "cubelm/cost/deck.hpp"
#include <gtest/gtest.h>

#include "cubelm/cost/deck.hpp"
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "cubelm/cost/deck.hpp"
using namespace cubelm;
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
namespace {
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
struct Case {
#include "cubelm/cost/deck.hpp"
  int cp, dp, pp;
#include "cubelm/cost/deck.hpp"
  const char* mode; // tensor_mode
#include "cubelm/cost/deck.hpp"
  int tp;
#include "cubelm/cost/deck.hpp"
  bool sp; // sequence parallelism (1d)
#include "cubelm/cost/deck.hpp"
  int experts; // 0: dense; else an MoE layer every second layer, top-2
#include "cubelm/cost/deck.hpp"
  int ep;
#include "cubelm/cost/deck.hpp"
  const char* schedule;
#include "cubelm/cost/deck.hpp"
  int virtual_stages, microbatches, zero;
#include "cubelm/cost/deck.hpp"
  const char* recompute;
#include "cubelm/cost/deck.hpp"
  int sequences = 2; // per micro-batch
#include "cubelm/cost/deck.hpp"
};
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
std::string describe(const Case& c) {
#include "cubelm/cost/deck.hpp"
  return "cp" + std::to_string(c.cp) + " dp" + std::to_string(c.dp) + " pp" + std::to_string(c.pp) +
#include "cubelm/cost/deck.hpp"
         " tp=" + c.mode + ":" + std::to_string(c.tp) + (c.sp ? "+sp" : "") +
#include "cubelm/cost/deck.hpp"
         (c.experts ? " experts" + std::to_string(c.experts) + " ep" + std::to_string(c.ep) : "") +
#include "cubelm/cost/deck.hpp"
         " " + c.schedule + " v" + std::to_string(c.virtual_stages) + " m" +
#include "cubelm/cost/deck.hpp"
         std::to_string(c.microbatches) + (c.zero ? " zero" : "") + " recompute=" + c.recompute;
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
Deck deck(const Case& c) {
#include "cubelm/cost/deck.hpp"
  // Micro-batches of sequences of 16 tokens: up to 8 chunks of 2.
#include "cubelm/cost/deck.hpp"
  const std::string moe = c.experts == 0 ? ""
#include "cubelm/cost/deck.hpp"
                                         : "experts = " + std::to_string(c.experts) +
#include "cubelm/cost/deck.hpp"
                                               "\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01\n";
#include "cubelm/cost/deck.hpp"
  const std::string text =
#include "cubelm/cost/deck.hpp"
      std::string("[model]\nvocab_size = 32\nseq_len = 16\nhidden = 16\nheads = 4\nlayers = 4\n") +
#include "cubelm/cost/deck.hpp"
      moe + "[parallel]\ntensor_mode = \"" + c.mode + "\"\ntensor_size = " + std::to_string(c.tp) +
#include "cubelm/cost/deck.hpp"
      "\nsequence_parallel = " + (c.sp ? "true" : "false") +
#include "cubelm/cost/deck.hpp"
      "\ncontext_size = " + std::to_string(c.cp) + "\ndata_size = " + std::to_string(c.dp) +
#include "cubelm/cost/deck.hpp"
      "\npipeline_size = " + std::to_string(c.pp) + "\nexpert_size = " + std::to_string(c.ep) +
#include "cubelm/cost/deck.hpp"
      "\nschedule = \"" + c.schedule + "\"\nvirtual_stages = " + std::to_string(c.virtual_stages) +
#include "cubelm/cost/deck.hpp"
      "\nmicrobatches = " + std::to_string(c.microbatches) + "\nzero = " + std::to_string(c.zero) +
#include "cubelm/cost/deck.hpp"
      "\nrecompute = \"" + c.recompute + "\"\n[train]\nsteps = 10\nglobal_batch = " +
#include "cubelm/cost/deck.hpp"
      std::to_string(c.sequences * c.dp * c.microbatches) +
#include "cubelm/cost/deck.hpp"
      "\nseed = 7\n[optimizer]\nlr = 1e-2\nwarmup_steps = 2\ngrad_clip = 1.0\n"
#include "cubelm/cost/deck.hpp"
      "[data]\nsynthetic_tokens = 5000\n[log]\npeak_gflops = 1.0\n";
#include "cubelm/cost/deck.hpp"
  return cost::parse_deck(text, "context_parallel.toml");
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
// One process running the same micro-batches in turn.
#include "cubelm/cost/deck.hpp"
Deck reference(const Case& c) {
#include "cubelm/cost/deck.hpp"
  return deck(Case{1, 1, 1, "none", 1, false, c.experts, 1, "1f1b", 1, c.dp * c.microbatches, 0,
#include "cubelm/cost/deck.hpp"
                   "none", c.sequences});
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
std::vector<Case> cases() {
#include "cubelm/cost/deck.hpp"
  switch (comm::Communicator::world().size()) {
#include "cubelm/cost/deck.hpp"
  case 2:
#include "cubelm/cost/deck.hpp"
    return {{2, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 0, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 2, 1, "full"},
#include "cubelm/cost/deck.hpp"
            {2, 1, 1, "none", 1, false, 4, 2, "1f1b", 1, 1, 0, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 1, 1, "none", 1, false, 4, 1, "1f1b", 1, 2, 1, "full"}};
#include "cubelm/cost/deck.hpp"
  case 4:
#include "cubelm/cost/deck.hpp"
    return {{4, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 0, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 2, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 1, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 1, 1, "1d", 2, false, 0, 1, "1f1b", 1, 1, 0, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 1, 2, "none", 1, false, 0, 1, "interleaved", 2, 2, 0, "full"},
#include "cubelm/cost/deck.hpp"
            {2, 2, 1, "none", 1, false, 4, 4, "1f1b", 1, 1, 1, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 1, 1, "1d", 2, true, 4, 2, "1f1b", 1, 1, 0, "none"}};
#include "cubelm/cost/deck.hpp"
  case 8:
#include "cubelm/cost/deck.hpp"
    return {{2, 1, 1, "2d", 4, false, 0, 1, "1f1b", 1, 1, 0, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 2, 1, "1d", 2, true, 0, 1, "1f1b", 1, 1, 0, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 2, 2, "none", 1, false, 0, 1, "gpipe", 1, 2, 1, "full"},
#include "cubelm/cost/deck.hpp"
            {2, 2, 2, "none", 1, false, 4, 4, "1f1b", 1, 2, 1, "none"},
#include "cubelm/cost/deck.hpp"
            {8, 1, 1, "none", 1, false, 0, 1, "1f1b", 1, 1, 0, "none"},
#include "cubelm/cost/deck.hpp"
            {2, 2, 1, "1d", 2, false, 4, 4, "1f1b", 1, 2, 0, "full"},
#include "cubelm/cost/deck.hpp"
            {2, 1, 1, "2d", 4, false, 4, 4, "1f1b", 1, 2, 0, "none"}};
#include "cubelm/cost/deck.hpp"
  case 16: // the cube (2 x 2 x 2 tensor ranks) twice, dense and MoE; MoE over 1d 2 x cp 2 x dp 4
#include "cubelm/cost/deck.hpp"
    return {{2, 1, 1, "3d", 8, false, 0, 1, "1f1b", 1, 1, 0, "none", 4},
#include "cubelm/cost/deck.hpp"
            {2, 1, 1, "3d", 8, false, 8, 8, "1f1b", 1, 1, 0, "full", 4},
#include "cubelm/cost/deck.hpp"
            {2, 4, 1, "1d", 2, false, 4, 4, "1f1b", 1, 1, 0, "none"}};
#include "cubelm/cost/deck.hpp"
  default: // a rank count without cases must not pass quietly
#include "cubelm/cost/deck.hpp"
    ADD_FAILURE() << "no cases for " << comm::Communicator::world().size()
#include "cubelm/cost/deck.hpp"
                  << " ranks: add them to this table";
#include "cubelm/cost/deck.hpp"
    return {};
#include "cubelm/cost/deck.hpp"
  }
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
using cubelm::testing::self;
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
} // namespace
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
// The single process's losses within 1e-4 relative over 10 AdamW steps (with clipping),
#include "cubelm/cost/deck.hpp"
// its load-balancing loss and gradient norm.
#include "cubelm/cost/deck.hpp"
TEST(ContextParallel, EveryLayoutTrainsLikeTheSingleProcess) {
#include "cubelm/cost/deck.hpp"
  for (const Case& c : cases()) {
#include "cubelm/cost/deck.hpp"
    SCOPED_TRACE(describe(c));
#include "cubelm/cost/deck.hpp"
    cubelm::testing::expect_same_training(deck(c), reference(c), 10);
#include "cubelm/cost/deck.hpp"
  }
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
// After one step every gradient element this rank holds (reduced over its replicas)
#include "cubelm/cost/deck.hpp"
// equals the single process's element at the same global index within 1e-5 of the
#include "cubelm/cost/deck.hpp"
// largest; ZeRO-1 keeps only a shard reduced, so those layouts are left to the losses.
#include "cubelm/cost/deck.hpp"
TEST(ContextParallel, GradientsEqualTheSingleProcess) {
#include "cubelm/cost/deck.hpp"
  for (const Case& c : cases()) {
#include "cubelm/cost/deck.hpp"
    if (c.zero)
#include "cubelm/cost/deck.hpp"
      continue;
#include "cubelm/cost/deck.hpp"
    SCOPED_TRACE(describe(c));
#include "cubelm/cost/deck.hpp"
    cubelm::testing::expect_same_gradients(deck(c), reference(c));
#include "cubelm/cost/deck.hpp"
  }
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
TEST(ContextParallel, MemoryPerRankMatchesTheEstimate) {
#include "cubelm/cost/deck.hpp"
  for (const Case& c : cases()) {
#include "cubelm/cost/deck.hpp"
    SCOPED_TRACE(describe(c));
#include "cubelm/cost/deck.hpp"
    cubelm::testing::expect_memory_as_estimated(deck(c));
#include "cubelm/cost/deck.hpp"
  }
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
// Every group's calls and bytes equal the closed form (the expert exchange's bytes
#include "cubelm/cost/deck.hpp"
// depend on the routing: its calls only).
#include "cubelm/cost/deck.hpp"
TEST(ContextParallel, TrafficFollowsTheClosedForm) {
#include "cubelm/cost/deck.hpp"
  for (const Case& c : cases()) {
#include "cubelm/cost/deck.hpp"
    SCOPED_TRACE(describe(c));
#include "cubelm/cost/deck.hpp"
    const Deck d = deck(c);
#include "cubelm/cost/deck.hpp"
    train::Trainer t(d);
#include "cubelm/cost/deck.hpp"
    t.step();
#include "cubelm/cost/deck.hpp"
    const train::StepMetrics m = t.step();
#include "cubelm/cost/deck.hpp"
    cubelm::testing::expect_traffic(m.traffic, cost::traffic_per_step(d, t.grid().coords().pp),
#include "cubelm/cost/deck.hpp"
                                    1e-9, {"ep"});
#include "cubelm/cost/deck.hpp"
  }
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
// The layout with the most context (then expert) parallelism of this world saves; one
#include "cubelm/cost/deck.hpp"
// process resumes with the same losses.
#include "cubelm/cost/deck.hpp"
TEST(ContextParallel, CheckpointResumesOnOneProcess) {
#include "cubelm/cost/deck.hpp"
  const auto all = cases();
#include "cubelm/cost/deck.hpp"
  ASSERT_FALSE(all.empty()) << "test_context_parallel runs at 2, 4, 8 or 16 ranks";
#include "cubelm/cost/deck.hpp"
  const Case c = *std::max_element(all.begin(), all.end(), [](const Case& a, const Case& b) {
#include "cubelm/cost/deck.hpp"
    return a.cp * 100 + a.ep * 10 + a.zero < b.cp * 100 + b.ep * 10 + b.zero;
#include "cubelm/cost/deck.hpp"
  });
#include "cubelm/cost/deck.hpp"
  SCOPED_TRACE(describe(c));
#include "cubelm/cost/deck.hpp"
  cubelm::testing::expect_resumes_on_one_process(deck(c), reference(c),
#include "cubelm/cost/deck.hpp"
                                                 "cubelm_test_context_parallel_", 3, 3);
#include "cubelm/cost/deck.hpp"
}
#include "cubelm/cost/deck.hpp"

#include "cubelm/cost/deck.hpp"
// The same, for a layout with both: experts spread over the context-parallel ranks.
#include "cubelm/cost/deck.hpp"
TEST(ContextParallel, ExpertTimesContextCheckpointResumesOnOneProcess) {
#include "cubelm/cost/deck.hpp"
  const auto all = cases();
#include "cubelm/cost/deck.hpp"
  const auto it =
#include "cubelm/cost/deck.hpp"
      std::find_if(all.begin(), all.end(), [](const Case& c) { return c.cp > 1 && c.ep > 1; });
#include "cubelm/cost/deck.hpp"
  ASSERT_NE(it, all.end());
#include "cubelm/cost/deck.hpp"
  SCOPED_TRACE(describe(*it));
#include "cubelm/cost/deck.hpp"
  cubelm::testing::expect_resumes_on_one_process(deck(*it), reference(*it),
#include "cubelm/cost/deck.hpp"
                                                 "cubelm_test_context_expert_", 2, 3);
#include "cubelm/cost/deck.hpp"
}
