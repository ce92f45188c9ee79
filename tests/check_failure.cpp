// Makes one library call fail on rank 1 while rank 0 waits in a barrier: the
// check macro must report rank, file:line, the call and the library's message,
// and abort the whole job.  Usage: check_failure mpi|hdf5

#include "cubelm/core/environment.hpp"
#include "cubelm/core/error.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <cstring>

int main(int argc, char** argv) {
  cubelm::Environment env(argc, argv);
  const bool hdf5 = argc > 1 && std::strcmp(argv[1], "hdf5") == 0;
  if (env.world_rank() == 1) {
    if (hdf5) {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); // our report alone
      CUBELM_HDF5_CHECK(H5Fopen("/nonexistent/cubelm/check.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    } else {
      int value = 42;
      const int no_such_rank = env.world_size() + 97;
      CUBELM_MPI_CHECK(MPI_Send(&value, 1, MPI_INT, no_such_rank, 0, MPI_COMM_WORLD));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD); // rank 0 would wait here forever without the abort
  return 0;
}
