// Background checkpoints (checkpoint.async): in every layout that checkpoints, the file a
// background write makes while training goes on equals, bitwise, the file a synchronous
// save of the same state makes, and so does one that the first rank writes alone
// (checkpoint.writers = "one"); the watchdog sees the writer apart from the main thread.
// This program runs MPI at MPI_THREAD_MULTIPLE (cubelm_test_wants_mpi_threads below).

#include "cubelm/comm/communicator.hpp"
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/train/checkpointing.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layouts.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// tests/mpi_main.cpp asks MPI for MPI_THREAD_MULTIPLE when the program defines this.
extern "C" bool cubelm_test_wants_mpi_threads() {
  return true;
}

using namespace cubelm;
using namespace cubelm::testing;
namespace fs = std::filesystem;

namespace {

// Every dataset of `a` equals `b`'s bit for bit, and both hold the same datasets and step.
void expect_same_contents(const std::string& a, const std::string& b, const std::string& label) {
  const comm::Communicator self = comm::Communicator::duplicate(MPI_COMM_SELF);
  const io::CheckpointReader ra(a, self), rb(b, self);
  const std::vector<std::string> names = ra.datasets();
  ASSERT_EQ(names, rb.datasets()) << label;
  EXPECT_EQ(ra.int_attribute("/", "step"), rb.int_attribute("/", "step")) << label;
  EXPECT_EQ(ra.int_attribute("/optimizer", "step"), rb.int_attribute("/optimizer", "step"))
      << label;
  int differing = 0;
  std::string first;
  for (const std::string& name : names) {
    const std::vector<std::uint64_t> shape = ra.shape(name);
    ASSERT_EQ(shape, rb.shape(name)) << label << " " << name;
    const io::Block block = io::Block::whole(shape);
    std::vector<float> x(block.size()), y(block.size());
    float nothing = 0;
    ra.read(name, block, x.empty() ? &nothing : x.data());
    rb.read(name, block, y.empty() ? &nothing : y.data());
    if (!x.empty() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0 &&
        differing++ == 0)
      first = name;
  }
  EXPECT_EQ(differing, 0) << label << ": " << differing << " dataset(s) differ, first " << first;
}

// Rank 0 reads both files alone (the others wait).
void expect_same_files(const std::string& a, const std::string& b, const std::string& label) {
  const comm::Communicator world = comm::Communicator::world();
  if (world.rank() == 0)
    expect_same_contents(a, b, label);
  MPI_Barrier(world.raw());
}

// The tests' model: the pipeline and context tests' (4 layers, sequences of 16), with
// `model` lines over it.
DeckText base(const std::string& model) {
  DeckText d;
  d.set("model.seq_len", 16).set("model.heads", 4).set("model.layers", 4);
  d.lines("model", model).layout_training(7).set("checkpoint.async", true);
  return d;
}

void expect_background_equals_sync(const std::vector<LayoutCase>& cases, const std::string& model) {
  ASSERT_FALSE(cases.empty()) << "no layout of " << world_size() << " ranks";
  const comm::Communicator world = comm::Communicator::world();
  const std::string dir = fs::path(temp_path("background_save")).replace_extension("").string();
  for (const LayoutCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Deck deck = case_deck(base(model), c, 4, "background.toml");
    train::Trainer trainer(deck);
    ASSERT_TRUE(trainer.saves_in_background()) << trainer.async_note();
    trainer.step();
    trainer.step();
    const std::string sync = dir + "/sync.h5", background = dir + "/background.h5";
    trainer.save(sync);
    // Under ZeRO every rank writes its own shard of the moments; the file equals one
    // written from the moments gathered onto the writing replica first.
    if (deck.parallel.zero) {
      const std::string gathered = dir + "/gathered.h5";
      const auto m = trainer.data_parallel().moments(0), v = trainer.data_parallel().moments(1);
      train::save_checkpoint(gathered, deck, trainer.model(), &m, &v, trainer.steps_done(), world,
                             trainer.updates_done());
      expect_same_files(sync, gathered, c.parallel + ", moments gathered");
    }
    int pruned = 0;
    trainer.save_in_background(background, [&] { ++pruned; });
    // Training goes on while the writer runs: the file holds the state of the copy. The
    // step learns of the end of the write if every writer is done by then.
    const train::StepMetrics m = trainer.step();
    const auto result =
        m.background.path.empty() ? trainer.finish_background_save() : std::optional(m.background);
    ASSERT_TRUE(result.has_value());
    EXPECT_EQ(result->error, "");
    EXPECT_EQ(result->path, background);
    EXPECT_EQ(result->step, 2);
    EXPECT_EQ(pruned, world.rank() == 0 ? 1 : 0) << "after_commit runs on rank 0 only";
    EXPECT_FALSE(trainer.finish_background_save().has_value()) << "nothing is left in flight";
    EXPECT_FALSE(fs::exists(io::CheckpointWriter::partial_path(background)));
    expect_same_files(sync, background, c.parallel);
    // checkpoint.writers = "one": the first rank writes what the others send it, in the
    // background and synchronously; the file holds what every rank's MPI-IO wrote.
    {
      DeckText text = base(model);
      text.set("checkpoint.writers", "one");
      train::Trainer one(case_deck(text, c, 4, "background.toml"));
      one.step();
      one.step();
      const std::string gathered = dir + "/one.h5";
      one.save_in_background(gathered, [] {});
      const auto done = one.finish_background_save();
      ASSERT_TRUE(done.has_value());
      EXPECT_EQ(done->error, "");
      expect_same_files(sync, gathered, c.parallel + ", checkpoint.writers = \"one\"");
      // And synchronously: under ZeRO each rank sends its shard of the moments itself.
      const std::string direct = dir + "/one_sync.h5";
      one.save(direct);
      expect_same_files(sync, direct, c.parallel + ", checkpoint.writers = \"one\", sync");
    }
    // The host buffers: what the rank writes (nothing on a replica), within the estimate.
    const cost::Memory mem = trainer.memory();
    const cost::Memory estimate = cost::estimate_memory(deck, trainer.grid().coords().pp);
    EXPECT_LE(mem.checkpoint_buffers, estimate.checkpoint_buffers);
    long long most = mem.checkpoint_buffers;
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_LONG_LONG, MPI_MAX, world.raw());
    EXPECT_GT(most, 0);
    MPI_Barrier(world.raw());
    if (world.rank() == 0)
      fs::remove_all(dir);
  }
}

// The tests that write in the background, skipped (with the reason) under an MPI known
// to hang when two threads communicate: cubelm writes synchronously there, which
// tests/train/test_second_thread.cpp checks.
class BackgroundSave : public ::testing::Test {
protected:
  void SetUp() override {
    if (const std::string why = comm::mpi_thread_hazard(comm::mpi_library()); !why.empty())
      GTEST_SKIP() << why;
  }
};

} // namespace

// Tensor (1D with and without sequence parallelism, 2D, 3D), pipeline (every schedule),
// data (with ZeRO-1) and context parallelism, and their combinations: the layouts of the
// allocation tests.
TEST_F(BackgroundSave, EqualsTheSynchronousSaveInEveryLayout) {
  expect_background_equals_sync(dense_layout_cases(), "");
}

// MoE: expert parallelism beside data, pipeline and 2D tensor parallelism, with ZeRO-1.
TEST_F(BackgroundSave, EqualsTheSynchronousSaveWithExperts) {
  expect_background_equals_sync(layout_cases("allocations_moe"),
                                "experts = 4\ntop_k = 2\nmoe_every = 2");
}

// A failed write is an error on every rank, naming the file; the trainer goes on.
TEST_F(BackgroundSave, AFailedWriteIsAnErrorOnEveryRankNamingTheFile) {
  const comm::Communicator world = comm::Communicator::world();
  const Deck deck = DeckText()
                        .set("checkpoint.async", true)
                        .set("parallel.data_size", world_size())
                        .deck("background.toml");
  train::Trainer trainer(deck);
  ASSERT_TRUE(trainer.saves_in_background());
  const std::string blocker = fs::path(temp_path("not_a_dir")).string();
  if (world.rank() == 0)
    std::ofstream(blocker) << "a file where a directory should be\n";
  MPI_Barrier(world.raw());
  const std::string path = blocker + "/step_00000001.h5";
  trainer.step();
  trainer.save_in_background(path, [] {});
  // Every rank learns of the end of the write at the same point: a step that finds all
  // writers done, or the wait.
  const train::StepMetrics m = trainer.step();
  const auto result =
      m.background.path.empty() ? trainer.finish_background_save() : std::optional(m.background);
  ASSERT_TRUE(result.has_value());
  EXPECT_NE(result->error.find(path), std::string::npos) << result->error;
  // The trainer goes on, and a later write works.
  trainer.step();
  const std::string good = fs::path(temp_path("after_failure")).string();
  trainer.save_in_background(good, [] {});
  const auto second = trainer.finish_background_save();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->error, "");
  MPI_Barrier(world.raw());
  if (world.rank() == 0) {
    fs::remove(blocker);
    fs::remove(good);
  }
}

// The writer's waits are watched apart from the main thread's: while it waits, the main
// thread's wait (watchdog::current) is unaffected.
TEST(BackgroundWriter, TheWatchdogSeesTheWriterApart) {
  const comm::Watchdog armed(60);
  std::thread writer([] {
    const comm::watchdog::SecondThread second;
    const comm::watchdog::Scope wait(comm::watchdog::intern("checkpoint"), "write");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(comm::watchdog::current().group, nullptr);
  writer.join();
  // One second thread at a time.
  const comm::watchdog::SecondThread first;
  std::string error;
  std::thread([&] {
    try {
      const comm::watchdog::SecondThread again;
    } catch (const InternalError& e) {
      error = e.what();
    }
  }).join();
  EXPECT_NE(error.find("already"), std::string::npos) << error;
}
