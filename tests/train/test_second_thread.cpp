// Whether a second thread may talk to MPI (comm::second_thread_problem): the rule for
// MPIs known to hang then, given library strings; the answer every rank gets; and a
// trainer asked for background checkpoints that writes synchronously instead, saying why. This
// program runs MPI at MPI_THREAD_FUNNELED.

#include "cubelm/comm/communicator.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace cubelm;
using namespace cubelm::testing;

namespace {

const std::string kRc2 = "Open MPI v6.0.0rc2, package: Debian OpenMPI, ident: 6.0.0rc2, repo rev: "
                         "2026-10-03, September 2026";

} // namespace

TEST(MpiThreadHazard, OpenMpi6ReleaseCandidates) {
  const std::string why = comm::mpi_thread_hazard(kRc2);
  EXPECT_HAS(why, "Open MPI v6.0.0rc2 (a release candidate) hangs");
  EXPECT_EQ(why.find("package"), std::string::npos) << "the version only: " << why;
  EXPECT_NE(comm::mpi_thread_hazard("Open MPI v6.0.0rc1, package: Open MPI"), "");
}

TEST(MpiThreadHazard, OtherMpisAreNotRestricted) {
  for (const char* library :
       {"Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 2022",
        "Open MPI v5.0.8, package: Open MPI", "Open MPI v6.0.0, package: Open MPI",
        "MPICH Version:      4.2.0\nMPICH Release date: Fri Feb  9 2024", ""})
    EXPECT_EQ(comm::mpi_thread_hazard(library), "") << library;
}

// At MPI_THREAD_FUNNELED every rank hears the same reason.
TEST(SecondThreadProblem, EveryRankGetsTheSameReason) {
  const comm::Communicator world = comm::Communicator::world();
  const std::string why = comm::second_thread_problem(world);
  EXPECT_EQ(why, "MPI does not run at MPI_THREAD_MULTIPLE");
  // agree(): the lowest rank's complaint reaches every rank.
  const std::string mine = world.rank() == 0 ? "" : "rank " + std::to_string(world.rank());
  EXPECT_EQ(comm::agree(world, mine), world.size() > 1 ? "rank 1" : "");
}

TEST(SecondThreadProblem, ATrainerWritesSynchronouslyAndSaysWhy) {
  const Deck deck = DeckText()
                        .set("checkpoint.async", true)
                        .set("parallel.data_size", world_size())
                        .deck("second_thread.toml");
  const train::Trainer trainer(deck);
  EXPECT_FALSE(trainer.saves_in_background());
  EXPECT_HAS(trainer.async_note(), "checkpoint.async = true needs a writer thread that talks to "
                                   "MPI beside training, but MPI does not run at "
                                   "MPI_THREAD_MULTIPLE");
  EXPECT_HAS(trainer.async_note(), "checkpoints are written synchronously");
}
