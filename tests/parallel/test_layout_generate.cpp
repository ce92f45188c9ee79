// Generation under a deck's layout (train::LayoutGenerator, `cubelm generate --deck`): in
// every layout the logits of each token fed equal those of the single-process generator
// (model::Generator, with its key/value cache) reading the same checkpoint, and greedy
// decoding picks the same tokens.

#include "cubelm/io/checkpoint.hpp"
#include "cubelm/model/generator.hpp"
#include "cubelm/train/generation.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layouts.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::testing;

namespace {

// The pipeline and context tests' model (seq_len 16, 4 layers, 4 heads).
DeckText base(const std::string& model) {
  DeckText d;
  d.set("model.seq_len", 16).set("model.heads", 4).set("model.layers", 4);
  return d.lines("model", model).layout_training(13);
}

// max |a - b| over the largest |b| (at least 1).
double difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1;
  for (std::size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

std::int32_t greedy(const std::vector<float>& logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Trains each case's layout for two steps, saves, and generates from the checkpoint under
// the same layout and on one process.
void expect_layouts_generate_like_one_process(const std::vector<LayoutCase>& cases,
                                              const std::string& model) {
  ASSERT_FALSE(cases.empty()) << "no layout of " << world_size() << " ranks";
  const std::string path = temp_path("cubelm_test_layout_generate_");
  double worst = 0;
  for (const LayoutCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Deck deck = case_deck(base(model), c, 4, "generate.toml");
    {
      train::Trainer t(deck);
      t.step();
      t.step();
      t.save(path);
    }
    train::LayoutGenerator spread(deck, path);
    const io::CheckpointReader reader(path, self());
    model::Generator one(reader, model::checkpoint_model(reader));
    ASSERT_EQ(spread.config().vocab_size, 32);
    std::vector<std::int32_t> feed{3, 1, 4, 1, 5};
    for (int i = 0; i < 8; ++i) {
      const std::vector<float> mine = spread.feed(feed);
      const std::vector<float>& reference = one.feed(feed);
      ASSERT_EQ(mine.size(), reference.size());
      const double d = difference(mine, reference);
      worst = std::max(worst, d);
      EXPECT_LT(d, 1e-5) << "position " << spread.position() - 1;
      ASSERT_EQ(greedy(mine), greedy(reference)) << "position " << spread.position() - 1;
      feed = {greedy(reference)};
    }
    EXPECT_EQ(spread.position(), 12);
  }
  if (comm::Communicator::world().rank() == 0)
    std::printf("%zu layouts of %d ranks: the logits differ by at most %.2e of the largest\n",
                cases.size(), world_size(), worst);
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm::Communicator::world().rank() == 0)
    std::filesystem::remove(path);
}

} // namespace

// Tensor (1D with and without sequence parallelism, 2D, 3D), pipeline (every schedule),
// data (with ZeRO-1) and context parallelism, and their combinations.
TEST(LayoutGenerate, EveryLayoutGeneratesLikeOneProcess) {
  expect_layouts_generate_like_one_process(dense_layout_cases(), "");
}

// MoE: expert parallelism beside data, pipeline and 2D tensor parallelism. Trained with a
// capacity factor that drops tokens; generation routes dropless, as on one process.
TEST(LayoutGenerate, EveryExpertLayoutGeneratesLikeOneProcess) {
  expect_layouts_generate_like_one_process(
      layout_cases("allocations_moe"),
      "experts = 4\ntop_k = 2\nmoe_every = 2\ncapacity_factor = 1.0");
}

// The deck's model must be the checkpoint's; the layout must fit the job.
TEST(LayoutGenerate, DeckMustMatchTheCheckpointAndTheJob) {
  const comm::Communicator world = comm::Communicator::world();
  const std::string path = temp_path("cubelm_test_layout_generate_errors_");
  const Deck deck = base("").deck("trained.toml");
  if (world.rank() == 0) {
    train::Trainer t(deck, self());
    t.save(path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  DeckText other = base("");
  other.set("model.hidden", 32).set("model.layers", 2);
  EXPECT_HAS(
      error_of([&] { train::LayoutGenerator g(other.deck("other.toml"), path, self()); }, true),
      "--deck other.toml: its model is not the checkpoint's (model.hidden = 16 there, 32 in the "
      "deck; model.layers = 4 there, 2 in the deck; checkpoint " +
          path + ")");
  DeckText big = base("");
  big.lines("parallel", "data_size = 16");
  big.set("train.global_batch", 16);
  EXPECT_HAS(error_of([&] { train::LayoutGenerator g(big.deck("big.toml"), path); }, true),
             "the job has " + std::to_string(world_size()) + " processes but the layout");
  train::LayoutGenerator g(deck, path, self());
  EXPECT_HAS(error_of(
                 [&] {
                   g.feed({1, 32});
                 },
                 true),
             "token 1 is 32, outside the vocabulary [0, 32)");
  g.feed(std::vector<std::int32_t>(16, 1));
  EXPECT_HAS(error_of([&] { g.feed({1}); }, true),
             "positions 16 to 16 do not fit the model's context: model.seq_len = 16");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0)
    std::filesystem::remove(path);
}
