// Makes one MPI call fail on rank 1 while rank 0 waits in a barrier: the check
// macro must report rank, file:line and MPI's message and abort the whole job.

#include "cubelm/core/environment.hpp"
#include "cubelm/core/error.hpp"

#include <mpi.h>

int main(int argc, char** argv) {
  cubelm::Environment env(argc, argv);
  if (env.world_rank() == 1) {
    int value = 42;
    const int no_such_rank = env.world_size() + 97;
    CUBELM_MPI_CHECK(MPI_Send(&value, 1, MPI_INT, no_such_rank, 0, MPI_COMM_WORLD));
  }
  MPI_Barrier(MPI_COMM_WORLD); // rank 0 would wait here forever without the abort
  return 0;
}
