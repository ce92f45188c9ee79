// The training loop: learning-rate schedule, loss decrease towards the
// synthetic floor, bitwise determinism, micro-batch accumulation.

#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/train/checkpointing.hpp"
#include "cubelm/train/lr_schedule.hpp"
#include "cubelm/train/trainer.hpp"

#include "damage.hpp"
#include "deck_text.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

Deck small_deck(int microbatches = 1, int steps = 60) {
  return DeckText()
      .set("model.seq_len", 16)
      .set("model.hidden", 32)
      .set("parallel.microbatches", microbatches)
      .set("train.seed", 5)
      .set("train.steps", steps)
      .set("optimizer.lr", 1e-2)
      .set("optimizer.min_lr", 1e-3)
      .set("optimizer.warmup_steps", 5)
      .set("data.format", "synthetic")
      .set("data.synthetic_tokens", 20000)
      .set("data.synthetic_branching", 2)
      .deck("test.toml");
}

} // namespace

TEST(Train, LearningRateScheduleClosedForm) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 14, 0), 0.25);
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 14, 3), 1.0);
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 14, 4), 1.0); // cosine starts at lr
  // r = (step - warmup) / (steps - warmup): 9/10 at the last of 14 steps.
  EXPECT_NEAR(train::learning_rate(o, 14, 13), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.9)), 1e-15);
  EXPECT_NEAR(train::learning_rate(o, 14, 9), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-15);
  EXPECT_NEAR(train::learning_rate(o, 14, 14), 0.1, 1e-15);
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 10, 0), 1.0);
}

TEST(Train, LossFallsTowardsTheEntropyFloor) {
  train::Trainer t(small_deck());
  const double floor = t.entropy_floor();
  EXPECT_NEAR(floor, std::log(2.0), 1e-12);
  const double first = t.step().loss;
  EXPECT_NEAR(first, std::log(32.0), 0.1); // untrained: uniform over the vocabulary
  double last = first;
  for (int s = 1; s < 60; ++s)
    last = t.step().loss;
  EXPECT_LT(last, first - 1.5);
  EXPECT_LT(last - floor, 1.0);
}

TEST(Train, RunsAreBitwiseDeterministic) {
  train::Trainer a(small_deck(1, 5)), b(small_deck(1, 5));
  for (int s = 0; s < 5; ++s) {
    const auto ma = a.step(), mb = b.step();
    EXPECT_EQ(std::memcmp(&ma.loss, &mb.loss, sizeof(double)), 0) << "step " << s;
    EXPECT_EQ(std::memcmp(&ma.grad_norm, &mb.grad_norm, sizeof(double)), 0);
  }
}

TEST(Train, MicroBatchesAccumulateToTheFullBatchGradient) {
  train::Trainer full(small_deck(1, 3)), split(small_deck(4, 3));
  for (int s = 0; s < 3; ++s) {
    const auto mf = full.step(), ms = split.step();
    EXPECT_NEAR(ms.loss, mf.loss, 1e-5 * mf.loss);
    EXPECT_NEAR(ms.grad_norm, mf.grad_norm, 1e-4 * mf.grad_norm);
  }
}

TEST(Train, MetricsLineAndJson) {
  train::StepMetrics m;
  m.step = 12;
  m.loss = 2.83111;
  m.grad_norm = 0.91;
  m.lr = 3e-4;
  m.ms = 142;
  m.tokens_per_s = 57600;
  m.gflops_per_rank = 31.2;
  m.mfu = 0.48;
  m.mem_bytes = 312 * 1048576LL;
  EXPECT_EQ(train::format_step(m, 200),
            "step 12/200 | loss 2.8311 | gnorm 0.91 | lr 3.0e-04 | 142 ms | 57.6k tok/s | 31.2 "
            "GFLOP/s/rank | MFU 48% | mem 312 MiB/rank");
  const std::string j = train::format_json(m);
  for (const char* key :
       {"\"step\": 12", "\"loss\"", "\"grad_norm\"", "\"lr\"", "\"ms\"", "\"tokens_per_s\"",
        "\"gflops_per_rank\"", "\"mfu\"", "\"mem_bytes\"", "\"comm_bytes\""})
    EXPECT_NE(j.find(key), std::string::npos) << key << " in " << j;
}

// MFU is the model's rate over a peak no step can beat: a step above the peak (here a
// peak far too low, as a deck might guess) raises it to its own rate, and MFU stays
// at most 1 in the metrics.
TEST(Train, MfuNeverExceedsOne) {
  train::Trainer t(small_deck(1, 4));
  t.set_peak_gflops(1e-6);
  const auto first = t.step();
  EXPECT_GT(first.gflops_per_rank, 1e-6);
  EXPECT_TRUE(first.peak_raised);
  EXPECT_EQ(first.peak_gflops, first.gflops_per_rank);
  EXPECT_EQ(first.mfu, 1.0);
  for (int s = 1; s < 4; ++s) {
    const auto m = t.step();
    EXPECT_LE(m.mfu, 1.0) << "step " << s;
    EXPECT_GE(m.peak_gflops, first.peak_gflops);
    if (m.peak_raised)
      EXPECT_EQ(m.peak_gflops, m.gflops_per_rank);
    else
      EXPECT_GE(m.peak_gflops, m.gflops_per_rank);
    EXPECT_NEAR(m.mfu, m.gflops_per_rank / m.peak_gflops, 1e-12);
    EXPECT_NE(train::format_json(m).find("\"peak_gflops\": "), std::string::npos);
  }
  // A peak above every step is kept as it is.
  train::Trainer u(small_deck(1, 2));
  u.set_peak_gflops(1e12, 0.25, 3); // a quarter of a node measured at 4e12 on 3 threads
  const auto m = u.step();
  EXPECT_FALSE(m.peak_raised);
  EXPECT_EQ(m.peak_gflops, 1e12);
  EXPECT_LT(m.mfu, 1e-3);
  // The share travels with the peak, so a report can put every run of a campaign
  // against one node rate (scripts/report).
  EXPECT_NE(train::format_json(m).find(
                "\"peak_gflops\": 1e+12, \"peak_share\": 0.25, \"peak_threads\": 3,"),
            std::string::npos)
      << train::format_json(m);
}

namespace {
std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("cubelm_test_train_" + std::to_string(::getpid()) + "_" + name))
      .string();
}
} // namespace

TEST(Train, ResumeContinuesBitwiseIdentically) {
  const std::string path = temp_file("resume.h5");
  train::Trainer straight(small_deck(1, 6)), first(small_deck(1, 6));
  std::vector<double> expected;
  for (int s = 0; s < 6; ++s)
    expected.push_back(straight.step().loss);
  for (int s = 0; s < 3; ++s)
    EXPECT_EQ(first.step().loss, expected[s]);
  first.save(path);
  train::Trainer second(small_deck(1, 6));
  second.resume(path);
  EXPECT_EQ(second.steps_done(), 3);
  for (int s = 3; s < 6; ++s) {
    const double loss = second.step().loss;
    EXPECT_EQ(std::memcmp(&loss, &expected[s], sizeof(double)), 0)
        << "step " << s << ": " << loss << " vs " << expected[s];
  }
  std::filesystem::remove(path);
}

namespace {
// Flips 64 bytes in the middle of the first data chunk of `dataset`: damage a checksum
// must catch, placed where HDF5's metadata is not (that is the fuzz tests' business).
void flip_chunk_bytes(const std::string& file, const char* dataset) {
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
    const hid_t space = H5Dget_space(d);
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info(d, space, 0, nullptr, &mask, &addr, &size), 0);
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(f);
  }
  ASSERT_GT(size, 64u);
  test::invert_bytes(file, static_cast<std::streamoff>(addr + size / 2 - 32), 64);
}
} // namespace

// A damaged newest checkpoint is refused by name, resume falls back to the one before,
// and the continuation equals the uninterrupted run bitwise. Truncated files are
// skipped the same way; unfinished .partial files are never candidates.
TEST(Train, DamagedCheckpointsAreSkippedAndTheRunContinuesBitwise) {
  for (const char* damage : {"flip", "truncate"}) {
    SCOPED_TRACE(damage);
    const std::string dir = temp_file(std::string("fallback_") + damage);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    train::Trainer straight(small_deck(1, 6)), first(small_deck(1, 6));
    std::vector<double> expected;
    for (int s = 0; s < 6; ++s)
      expected.push_back(straight.step().loss);
    for (int s = 0; s < 4; ++s) {
      first.step();
      if (s == 1 || s == 3)
        first.save(train::checkpoint_path(dir, s + 1));
    }
    const std::string newest = train::checkpoint_path(dir, 4);
    if (std::string(damage) == "flip")
      flip_chunk_bytes(newest, "/model/layers/1/mlp/w1");
    else
      std::filesystem::resize_file(newest, std::filesystem::file_size(newest) / 2);
    std::ofstream(dir + "/step_00000009.h5.partial") << "an unfinished write";

    train::Trainer second(small_deck(1, 6));
    std::vector<std::pair<std::string, std::string>> skipped;
    const std::string loaded =
        second.resume_newest(dir, [&](const std::string& file, const std::string& why) {
          skipped.emplace_back(file, why);
        });
    EXPECT_EQ(loaded, train::checkpoint_path(dir, 2));
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_EQ(skipped[0].first, newest);
    EXPECT_NE(skipped[0].second.find(newest), std::string::npos) << skipped[0].second;
    if (std::string(damage) == "flip")
      EXPECT_NE(skipped[0].second.find("/model/layers/1/mlp/w1: cannot be read: a Fletcher32 "
                                       "checksum does not match"),
                std::string::npos)
          << skipped[0].second;
    EXPECT_EQ(second.steps_done(), 2);
    for (int s = 2; s < 6; ++s) {
      const double loss = second.step().loss;
      EXPECT_EQ(std::memcmp(&loss, &expected[s], sizeof(double)), 0)
          << "step " << s << ": " << loss << " vs " << expected[s];
    }
    std::filesystem::remove_all(dir);
  }
}

// With every checkpoint damaged, resume = "auto" refuses instead of starting over.
TEST(Train, NoLoadableCheckpointIsAnError) {
  const std::string dir = temp_file("fallback_none");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(train::checkpoint_path(dir, 3)) << "not an HDF5 file";
  train::Trainer t(small_deck(1, 6));
  int skipped = 0;
  try {
    t.resume_newest(dir, [&](const std::string&, const std::string&) { ++skipped; });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_NE(std::string(e.what()).find("none of the 1 checkpoints in " + dir), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(t.resume_newest(dir + "/empty", [](const std::string&, const std::string&) {}), "");
  std::filesystem::remove_all(dir);
}

TEST(Train, CheckpointOfAnotherShapeIsRefused) {
  const std::string path = temp_file("shape.h5");
  train::Trainer t(small_deck(1, 2));
  t.save(path);
  Deck other = small_deck(1, 2);
  other.model.hidden = 64;
  {
    train::Trainer u(other);
    try {
      u.resume(path);
      FAIL() << "a checkpoint with hidden 32 was loaded into hidden 64";
    } catch (const train::OtherRunCheckpoint& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path + " is another run's: model.hidden = 32 there, 64 in the deck."),
                std::string::npos)
          << m;
      EXPECT_TRUE(e.collective());
    }
  }
  // Allowed to be another run's, the shapes still have to fit.
  other.checkpoint.allow_other_run = true;
  train::Trainer u(other);
  try {
    u.resume(path);
    FAIL() << "a checkpoint with hidden 32 was loaded into hidden 64";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("/model/wte has shape [32, 32], the deck needs [32, 64]"), std::string::npos)
        << m;
  }
  Deck fewer = small_deck(1, 2);
  fewer.model.layers = 1;
  fewer.checkpoint.allow_other_run = true;
  train::Trainer w(fewer);
  EXPECT_THROW(w.resume(path), Error);
  std::filesystem::remove(path);
}

// The identity keys with their values, as run_identity writes them into every checkpoint.
TEST(RunIdentity, KeysAndValues) {
  Deck d = small_deck(1, 2);
  d.model.aux_loss = 0.01;
  d.data.path = "tokens.bin";
  d.data.val_fraction = 0.05;
  std::string text;
  for (const auto& k : train::run_identity(d))
    text += k.key + " = " + k.value + "\n";
  EXPECT_EQ(text, "model.vocab_size = 32\nmodel.seq_len = 16\nmodel.hidden = 32\n"
                  "model.heads = 2\nmodel.layers = 2\nmodel.experts = 0\nmodel.top_k = 2\n"
                  "model.moe_every = 1\nmodel.capacity_factor = 0\nmodel.aux_loss = 0.01\n"
                  "train.seed = 5\ntrain.global_batch = 8\ntrain.precision = \"fp32\"\n"
                  "data.format = \"synthetic\"\ndata.path = \"tokens.bin\"\n"
                  "data.sampler = \"shuffle\"\ndata.synthetic_tokens = 20000\n"
                  "data.synthetic_branching = 2\ndata.val_fraction = 0.05\n");
}

// What a continuation may change (steps, the optimizer, the layout, checkpoints, logs)
// is not compared; the identity is, key by key, also when resume = "auto" finds it; with
// allow_other_run the checkpoint loads and the note names the differences.
TEST(RunIdentity, ResumeComparesTheIdentity) {
  const std::string dir = temp_file("identity");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = train::checkpoint_path(dir, 2);
  const Deck base = small_deck(1, 2);
  {
    train::Trainer t(base);
    t.step();
    t.step();
    t.save(path);
  }
  Deck continued = small_deck(2, 10); // more steps, two micro-batches
  continued.optimizer.lr = 3e-3;
  continued.optimizer.warmup_steps = 0;
  continued.checkpoint.keep = 3;
  continued.log.interval = 5;
  {
    train::Trainer t(continued);
    t.resume(path);
    EXPECT_EQ(t.steps_done(), 2);
    EXPECT_EQ(t.resume_note(), "");
  }
  Deck seed = base;
  seed.train.seed = 99;
  seed.data.format = "llmc";
  seed.data.path = "train.bin";
  {
    Deck reader_deck = seed;
    reader_deck.data = base.data; // a trainer of the synthetic corpus, another seed
    train::Trainer u(reader_deck);
    try {
      u.resume_newest(dir, [](const std::string& f, const std::string& why) {
        ADD_FAILURE() << "skipped " << f << ": " << why;
      });
      FAIL() << "resume = \"auto\" took a checkpoint of seed 5 for seed 99";
    } catch (const train::OtherRunCheckpoint& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("train.seed = 5 there, 99 in the deck"), std::string::npos) << m;
      EXPECT_NE(m.find("checkpoint.allow_other_run = true"), std::string::npos) << m;
    }
  }
  const auto differences = train::run_differences(path, seed, cubelm::comm::Communicator::world());
  ASSERT_EQ(differences.size(), 3u);
  EXPECT_EQ(train::describe_differences(differences),
            "train.seed = 5 there, 99 in the deck; data.format = \"synthetic\" there, \"llmc\" "
            "in the deck; data.path = \"\" there, \"train.bin\" in the deck");
  Deck allowed = base;
  allowed.train.seed = 7;
  allowed.checkpoint.allow_other_run = true;
  train::Trainer a(allowed);
  a.resume(path);
  EXPECT_EQ(a.steps_done(), 2);
  EXPECT_EQ(a.resume_note(), "checkpoint " + path +
                                 " is another run's (train.seed = 5 there, 7 in the deck): "
                                 "resumed from it anyway (checkpoint.allow_other_run = true)");
  std::filesystem::remove_all(dir);
}

// Training from step 0 into a directory: another run's checkpoints are refused, those of
// an earlier run of the same identity counted (to be replaced).
TEST(RunIdentity, FreshStartChecksTheDirectory) {
  const std::string dir = temp_file("fresh");
  std::filesystem::remove_all(dir);
  Deck d = small_deck(1, 2);
  d.checkpoint.dir = dir;
  EXPECT_EQ(train::Trainer(d).check_checkpoint_dir(), 0); // no directory yet
  {
    train::Trainer t(d);
    t.save(train::checkpoint_path(dir, 0));
    t.step();
    t.save(train::checkpoint_path(dir, 1));
  }
  Deck again = d;
  again.train.steps = 50;
  again.optimizer.lr = 1e-3;
  EXPECT_EQ(train::Trainer(again).check_checkpoint_dir(), 2);
  Deck other = d;
  other.model.layers = 3;
  try {
    train::Trainer(other).check_checkpoint_dir();
    FAIL() << "a run of 3 layers would write over a run of 2";
  } catch (const train::OtherRunCheckpoint& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("it is another run's (model.layers = 2 there, 3 in the deck)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("checkpoint.dir"), std::string::npos) << m;
  }
  // A file that cannot be read is no run's the new one may write over.
  {
    std::ofstream junk(train::checkpoint_path(dir, 7));
    junk << "not a checkpoint";
  }
  try {
    train::Trainer(again).check_checkpoint_dir();
    FAIL() << "an unreadable step_00000007.h5 was taken for this run's";
  } catch (const train::OtherRunCheckpoint& e) {
    EXPECT_NE(std::string(e.what()).find("cannot tell whose it is"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Train, CheckpointFilesAreFoundAndPruned) {
  const std::string dir = temp_file("dir");
  std::filesystem::create_directories(dir);
  for (int s : {2, 10, 4})
    std::ofstream(train::checkpoint_path(dir, s)) << "x";
  std::ofstream(dir + "/step_00000012.h5.partial") << "x"; // unfinished: ignored
  EXPECT_EQ(train::checkpoint_path(dir, 12), dir + "/step_00000012.h5");
  EXPECT_EQ(train::latest_checkpoint(dir), train::checkpoint_path(dir, 10));
  train::prune_checkpoints(dir, 2);
  EXPECT_FALSE(std::filesystem::exists(train::checkpoint_path(dir, 2)));
  EXPECT_TRUE(std::filesystem::exists(train::checkpoint_path(dir, 4)));
  EXPECT_TRUE(std::filesystem::exists(train::checkpoint_path(dir, 10)));
  // After a fallback to step 4 (10 did not load) and a new checkpoint at step 6, keep = 1
  // removes 4 but leaves 10, which is neither counted nor the run's newest.
  std::ofstream(train::checkpoint_path(dir, 6)) << "x";
  train::prune_checkpoints(dir, 1, 6);
  EXPECT_FALSE(std::filesystem::exists(train::checkpoint_path(dir, 4)));
  EXPECT_TRUE(std::filesystem::exists(train::checkpoint_path(dir, 6)));
  EXPECT_TRUE(std::filesystem::exists(train::checkpoint_path(dir, 10)));
  EXPECT_EQ(train::latest_checkpoint(dir + "/none"), "");
  std::filesystem::remove_all(dir);
}
