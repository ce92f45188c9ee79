// A vocabulary that does not split over the layout is padded (model.vocab_divisible_by,
// tp::padded_vocab): the padded rows are zero, never predicted and never stored, so
// training equals the unpadded model's and checkpoints are the vocabulary's rows only,
// read by any layout, padded or not.

#include "cubelm/cost/deck.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/tp/shapes.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layouts.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <filesystem>
#include <string>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

constexpr int kVocab = 50; // splits over none of the layouts below

// The deck with `parallel` as its [parallel] lines.
Deck deck(const std::string& parallel, int divisible_by) {
  return DeckText()
      .set("model.vocab_size", kVocab)
      .set("model.vocab_divisible_by", divisible_by)
      .set("model.heads", 8)
      .lines("parallel", parallel)
      .set("train.global_batch", 4)
      .set("train.seed", 5)
      .set("optimizer.lr", 1e-2)
      .set("optimizer.warmup_steps", 2)
      .set("data.synthetic_tokens", 5000)
      .deck("padding.toml");
}

// The tensor modes this world fits, padded to multiples of 16 (64 rows).
std::vector<Deck> padded_decks() {
  std::vector<Deck> out;
  for (const std::string& parallel : cubelm::testing::layouts("padding"))
    out.push_back(deck(parallel, 16));
  if (out.empty())
    ADD_FAILURE() << "tests/layouts.hpp: no \"padding\" case for " << cubelm::testing::world_size()
                  << " ranks";
  return out;
}

// This rank's padding rows of wte, value or gradient, are all exactly zero.
void expect_padding_zero(train::Trainer& t) {
  const auto& wte = t.model().param("wte");
  const auto value = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), wte.value);
  const auto grad = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), wte.grad);
  const std::int64_t cols = wte.local[1];
  for (std::int64_t r = 0; r < wte.local[0]; ++r)
    if (wte.offset[0] + r >= kVocab)
      for (std::int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(value(r * cols + c), 0.0f) << "row " << wte.offset[0] + r;
        ASSERT_EQ(grad(r * cols + c), 0.0f) << "row " << wte.offset[0] + r;
      }
}

} // namespace

TEST(VocabPadding, PaddedVocabularyOfEachLayout) {
  const Deck d = deck("", 16);
  EXPECT_EQ(tp::padded_vocab(d.model, comm::Layout{1, 1, 1, TensorMode::none}), 64);
  EXPECT_EQ(tp::padded_vocab(d.model, comm::Layout{1, 1, 8, TensorMode::d1}), 64);
  EXPECT_EQ(tp::padded_vocab(d.model, comm::Layout{1, 1, 27, TensorMode::d3}), 144); // lcm 144
  ModelConfig gpt2;
  gpt2.vocab_size = 50257; // GPT-2's tokenizer, padded as llm.c does
  EXPECT_EQ(tp::padded_vocab(gpt2, comm::Layout{1, 1, 1, TensorMode::none}), 50304);
  EXPECT_EQ(tp::padded_vocab(gpt2, comm::Layout{1, 1, 64, TensorMode::d2}), 50304);
  EXPECT_EQ(tp::padded_vocab(gpt2, comm::Layout{1, 1, 27, TensorMode::d3}), 50688);
  gpt2.vocab_divisible_by = 1;
  EXPECT_EQ(tp::padded_vocab(gpt2, comm::Layout{1, 1, 1, TensorMode::none}), 50257);
}

// Ten AdamW steps of every padded layout against the unpadded model on one process.
TEST(VocabPadding, TrainingEqualsTheUnpaddedModel) {
  for (const Deck& d : padded_decks()) {
    SCOPED_TRACE(comm::layout_of(d.parallel).describe());
    train::Trainer padded(d), plain(deck("", 1), cubelm::testing::self());
    EXPECT_EQ(padded.model().param("wte").shape[0], 64);
    EXPECT_EQ(plain.model().param("wte").shape[0], kVocab);
    for (int s = 0; s < 10; ++s) {
      const auto a = padded.step(), b = plain.step();
      EXPECT_NEAR(a.loss, b.loss, 1e-5 * b.loss) << "step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * b.grad_norm) << "step " << s;
    }
    expect_padding_zero(padded);
  }
}

// The file holds wte's 50 rows (and its moments'); an unpadded process and one padded
// to 128 rows resume from it with the losses of the run that wrote it.
TEST(VocabPadding, CheckpointsHoldTheVocabularyRowsOnly) {
  const comm::Communicator world = comm::Communicator::world();
  const std::string path = cubelm::testing::temp_path("cubelm_test_padding_");
  const std::vector<Deck> decks = padded_decks();
  ASSERT_FALSE(decks.empty());
  const Deck d = decks.back();
  train::Trainer writer(d);
  for (int s = 0; s < 3; ++s)
    writer.step();
  writer.save(path);
  std::vector<double> losses;
  for (int s = 3; s < 6; ++s)
    losses.push_back(writer.step().loss);
  {
    const io::CheckpointReader r(path, world);
    EXPECT_EQ(r.shape("/model/wte"), (std::vector<std::uint64_t>{kVocab, 16}));
    EXPECT_EQ(r.shape("/optimizer/m/wte"), (std::vector<std::uint64_t>{kVocab, 16}));
    EXPECT_EQ(r.int_attribute("/", "padded_vocab_size"), 64);
  }
  if (world.rank() == 0)
    for (const int divisible_by : {1, 128}) {
      SCOPED_TRACE("vocab_divisible_by = " + std::to_string(divisible_by));
      train::Trainer reader(deck("", divisible_by), cubelm::testing::self());
      reader.resume(path);
      expect_padding_zero(reader);
      for (int s = 3; s < 6; ++s)
        EXPECT_NEAR(reader.step().loss, losses[static_cast<std::size_t>(s - 3)],
                    1e-4 * losses[static_cast<std::size_t>(s - 3)])
            << "step " << s;
    }
  MPI_Barrier(world.raw());
  if (world.rank() == 0)
    std::filesystem::remove(path);
}
