// Held-out validation (data.val_fraction, data.val_path, [eval]): in every layout the
// validation loss equals the single process's, validating leaves training bitwise as it
// is, and validation's collectives stay out of the steps' traffic.

#include "cubelm/io/tokens.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layouts.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::testing;

namespace {

// The pipeline and context tests' model, 20% of a synthetic corpus of 10000 tokens held
// out, two validation batches.
DeckText base(const std::string& model) {
  DeckText d;
  d.set("model.seq_len", 16).set("model.heads", 4).set("model.layers", 4);
  d.lines("model", model).layout_training(11);
  return d.set("data.synthetic_tokens", 10000).set("data.val_fraction", 0.2).set("eval.batches", 2);
}

// The relative difference of two losses.
double relative(double a, double b) {
  return std::abs(a - b) / std::abs(b);
}

// Every parameter block of `a` equals `b`'s bit for bit.
bool same_parameters(const train::Trainer& a, const train::Trainer& b) {
  const auto pa = a.params(), pb = b.params();
  if (pa.size() != pb.size())
    return false;
  for (std::size_t k = 0; k < pa.size(); ++k) {
    const auto x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pa[k]->value);
    const auto y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pb[k]->value);
    if (x.span() != y.span() || std::memcmp(x.data(), y.data(), x.span() * sizeof(*x.data())) != 0)
      return false;
  }
  return true;
}

void expect_layouts_validate_like_one_process(const std::vector<LayoutCase>& cases,
                                              const std::string& model) {
  ASSERT_FALSE(cases.empty()) << "no layout of " << world_size() << " ranks";
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const LayoutCase& c = cases[i];
    SCOPED_TRACE(describe(c));
    const Deck deck = case_deck(base(model), c, 4, "validation.toml");
    train::Trainer group(deck);
    train::Trainer one(case_deck(base(model), on_one_process(c), 4, "one.toml"), self());
    ASSERT_EQ(group.validation_batches(), 2);
    ASSERT_EQ(group.tokens().validation, 2000); // 20% of 10000
    ASSERT_EQ(group.tokens().train, 8000);
    // Before training and after two steps.
    for (int round = 0; round < 2; ++round) {
      const std::optional<double> mine = group.validate(), reference = one.validate();
      ASSERT_TRUE(mine.has_value() && reference.has_value());
      EXPECT_LT(relative(*mine, *reference), 1e-5)
          << "round " << round << ": " << *mine << " against " << *reference;
      group.step();
      group.step();
      one.step();
      one.step();
    }
    // The first and the last case: validation leaves training bitwise as it is, and its
    // traffic stays out of the steps'.
    if (i != 0 && i + 1 != cases.size())
      continue;
    train::Trainer plain(deck);
    double sent = 0;
    for (int s = 0; s < 4; ++s)
      for (const comm::TrafficEntry& e : plain.step().traffic)
        sent += e.bytes;
    const train::StepMetrics last = group.step(), again = plain.step();
    for (const comm::TrafficEntry& e : again.traffic)
      sent += e.bytes;
    EXPECT_EQ(last.loss, again.loss);
    EXPECT_EQ(last.grad_norm, again.grad_norm);
    EXPECT_TRUE(same_parameters(group, plain)) << "validation changed the training";
    double counted = 0;
    for (const comm::TrafficEntry& e : group.traffic())
      counted += e.bytes;
    EXPECT_EQ(counted, sent) << "the steps' traffic includes validation's";
  }
}

} // namespace

// Tensor (1D with and without sequence parallelism, 2D, 3D), pipeline (every schedule),
// data (with ZeRO-1) and context parallelism, and their combinations.
TEST(Validation, EveryLayoutValidatesLikeTheSingleProcess) {
  expect_layouts_validate_like_one_process(dense_layout_cases(), "");
}

// MoE: expert parallelism beside data, pipeline and 2D tensor parallelism.
TEST(Validation, EveryExpertLayoutValidatesLikeTheSingleProcess) {
  expect_layouts_validate_like_one_process(layout_cases("allocations_moe"),
                                           "experts = 4\ntop_k = 2\nmoe_every = 2");
}

// A run without validation tokens has no validation.
TEST(Validation, NoneWithoutValidationTokens) {
  DeckText d = base("");
  d.erase("data.val_fraction").erase("eval.batches");
  train::Trainer t(d.deck("plain.toml"), self());
  EXPECT_EQ(t.validation_batches(), 0);
  EXPECT_FALSE(t.validate().has_value());
  EXPECT_EQ(t.tokens().train, 10000);
}

// The split's counts and each rule's message.
TEST(Validation, TokenSplitRules) {
  DeckText d = base("");
  d.set("train.global_batch", 4).set("eval.batches", 100);
  const Deck deck = d.deck("split.toml");
  // 1000 held-out tokens hold (1000 - 2) / (4 x 16) = 15 whole batches.
  const io::TokenSplit s = io::split_tokens(deck, 5000); // the deck's fraction, 0.2
  EXPECT_EQ(s.train, 4000);
  EXPECT_EQ(s.validation, 1000);
  EXPECT_EQ(s.batches, 15);
  // Exactly one batch needs 4 x 16 + 2 tokens.
  Deck file = deck;
  file.data.val_fraction = 0;
  file.data.val_path = "val.bin";
  EXPECT_EQ(io::split_tokens(file, 5000, 66).batches, 1);
  EXPECT_EQ(io::split_tokens(file, 5000, 66).train, 5000);
  EXPECT_HAS(error_of([&] { io::split_tokens(file, 5000, 65); }, true),
             "data.val_path = val.bin holds 65 tokens, fewer than one validation batch needs "
             "(train.global_batch 4 x model.seq_len 16 + 2 = 66)");
  Deck small = deck;
  small.data.val_fraction = 0.01;
  EXPECT_HAS(error_of([&] { io::split_tokens(small, 5000); }, true),
             "data.val_fraction = 0.01 holds out 50 of the 5000 tokens of the synthetic corpus");
  Deck most = deck;
  most.data.val_fraction = 0.5;
  EXPECT_HAS(error_of([&] { io::split_tokens(most, 30); }, true),
             "data.val_fraction = 0.5 leaves 15 of the 30 tokens of the synthetic corpus for "
             "training, fewer than model.seq_len + 2 = 18");
}

// The step line and the metrics object carry the validation loss when there is one.
TEST(Validation, StepLineAndMetrics) {
  train::StepMetrics m;
  m.step = 3;
  m.loss = 2;
  EXPECT_EQ(train::format_step(m, 10).find("val"), std::string::npos);
  EXPECT_EQ(train::format_json(m).find("val_loss"), std::string::npos);
  m.val_loss = 1.5;
  m.val_ms = 12;
  EXPECT_HAS(train::format_step(m, 10), "step 3/10 | loss 2.0000 | val 1.5000 | gnorm");
  EXPECT_HAS(train::format_json(m), "\"val_loss\": 1.5, \"val_ms\": 12");
}
