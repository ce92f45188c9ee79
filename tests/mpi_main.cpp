// The one GoogleTest main of every cubelm test program: MPI and Kokkos come up
// through cubelm::Environment, all ranks run every test, rank 0 prints the
// usual report and the other ranks print only their failures, and the exit
// code is non-zero if any rank failed.

#include "cubelm/core/environment.hpp"
#include "cubelm/kernels/blas.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

// Prints failed assertions of a non-zero rank, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
  }

private:
  int rank_;
};

} // namespace

// A test program that defines this (returning true) runs MPI at MPI_THREAD_MULTIPLE, as
// `cubelm train` does for checkpoint.async; the others at MPI_THREAD_FUNNELED.
extern "C" __attribute__((weak)) bool cubelm_test_wants_mpi_threads() {
  return false;
}

int main(int argc, char** argv) {
  // The BLAS kernels that fit the processor, as cubelm itself runs (kernels/blas.hpp).
  cubelm::kernels::ensure_blas_kernels(argv);
  int failed = 0;
  {
    cubelm::Environment env(argc, argv, cubelm_test_wants_mpi_threads());
    ::testing::InitGoogleTest(&argc, argv);
    if (env.world_rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(env.world_rank()));
    }
    const int local = RUN_ALL_TESTS();
    MPI_Allreduce(&local, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (env.world_rank() == 0 && failed != local)
      std::fprintf(stderr, "cubelm tests: a test failed on another rank (see [rank N] lines)\n");
  }
  return failed;
}
