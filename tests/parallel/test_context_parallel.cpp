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
#include "layouts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

// A layout of tests/layouts.hpp: its [parallel] lines, [model] lines over the dense model
// below (an MoE layer every second layer, top-2, when it has experts), and sequences per
// micro-batch (2 unless it says).
using Case = cubelm::testing::LayoutCase;

using cubelm::testing::describe;

Deck deck(const Case& c) {
  // Micro-batches of sequences of 16 tokens: up to 8 chunks of 2.
  return cubelm::testing::case_deck(DeckText()
                                        .set("model.seq_len", 16)
                                        .set("model.heads", 4)
                                        .set("model.layers", 4)
                                        .layout_training(7),
                                    c, 2, "context_parallel.toml");
}

// One process running the same micro-batches in turn.
Deck reference(const Case& c) {
  return deck(cubelm::testing::on_one_process(c));
}

using cubelm::testing::self;

} // namespace

// The single process's losses within 1e-4 relative over 10 AdamW steps (with clipping),
// its load-balancing loss and gradient norm.
TEST(ContextParallel, EveryLayoutTrainsLikeTheSingleProcess) {
  for (const Case& c : cubelm::testing::required_cases("context_parallel")) {
    SCOPED_TRACE(describe(c));
    cubelm::testing::expect_same_training(deck(c), reference(c), 10);
  }
}

// After one step every gradient element this rank holds (reduced over its replicas)
// equals the single process's element at the same global index within 1e-5 of the
// largest; ZeRO-1 keeps only a shard reduced, so those layouts are left to the losses.
TEST(ContextParallel, GradientsEqualTheSingleProcess) {
  for (const Case& c : cubelm::testing::required_cases("context_parallel")) {
    if (deck(c).parallel.zero)
      continue;
    SCOPED_TRACE(describe(c));
    cubelm::testing::expect_same_gradients(deck(c), reference(c));
  }
}

// The same under bf16 (the key and value blocks and their gradients travel as bf16):
// the single bf16 process's gradients up to rounding, within 2e-2 of the largest (measured: up to
// 7e-3).
TEST(ContextParallel, Bf16GradientsEqualTheSingleBf16Process) {
  using cubelm::testing::with_precision;
  for (const Case& c : cubelm::testing::required_cases("context_parallel")) {
    if (deck(c).parallel.zero)
      continue;
    SCOPED_TRACE(describe(c));
    cubelm::testing::expect_same_gradients(with_precision(deck(c), Precision::bf16),
                                           with_precision(reference(c), Precision::bf16), 2e-2);
  }
}

TEST(ContextParallel, MemoryPerRankMatchesTheEstimate) {
  for (const Case& c : cubelm::testing::required_cases("context_parallel")) {
    SCOPED_TRACE(describe(c));
    cubelm::testing::expect_memory_as_estimated(deck(c));
  }
}

// Every group's calls and bytes equal the closed form (the expert exchange's bytes
// depend on the routing: its calls only).
TEST(ContextParallel, TrafficFollowsTheClosedForm) {
  for (const Case& c : cubelm::testing::required_cases("context_parallel"))
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(describe(c) + ", " + precision_name(precision));
      const Deck d = cubelm::testing::with_precision(deck(c), precision);
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
  const auto all = cubelm::testing::required_cases("context_parallel");
  ASSERT_FALSE(all.empty()) << "test_context_parallel runs at 2, 4, 8 or 16 ranks";
  const Case c = *std::max_element(all.begin(), all.end(), [](const Case& a, const Case& b) {
    auto rank = [](const Case& x) {
      const ParallelConfig p = deck(x).parallel;
      return p.context_size * 100 + p.expert_size * 10 + p.zero;
    };
    return rank(a) < rank(b);
  });
  SCOPED_TRACE(describe(c));
  cubelm::testing::expect_resumes_on_one_process(deck(c), reference(c),
                                                 "cubelm_test_context_parallel_", 3, 3);
}

// The same, for a layout with both: experts spread over the context-parallel ranks.
TEST(ContextParallel, ExpertTimesContextCheckpointResumesOnOneProcess) {
  const auto all = cubelm::testing::required_cases("context_parallel");
  const auto it = std::find_if(all.begin(), all.end(), [](const Case& c) {
    const ParallelConfig p = deck(c).parallel;
    return p.context_size > 1 && p.expert_size > 1;
  });
  ASSERT_NE(it, all.end());
  SCOPED_TRACE(describe(*it));
  cubelm::testing::expect_resumes_on_one_process(deck(*it), reference(*it),
                                                 "cubelm_test_context_expert_", 2, 3);
}
