#include "cubelm/comm/communicator.hpp"

#include "cubelm/core/error.hpp"

namespace cubelm::comm {

namespace {
void free_comm(MPI_Comm* comm) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After MPI_Finalize there is nothing left to free (and calling would be an error).
  if (!finalized && *comm != MPI_COMM_NULL)
    MPI_Comm_free(comm);
  delete comm;
}
} // namespace

Communicator::Communicator(MPI_Comm owned) : comm_(new MPI_Comm(owned), free_comm) {
  CUBELM_MPI_CHECK(MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN));
  CUBELM_MPI_CHECK(MPI_Comm_rank(owned, &rank_));
  CUBELM_MPI_CHECK(MPI_Comm_size(owned, &size_));
}

Communicator Communicator::world() {
  return duplicate(MPI_COMM_WORLD);
}

Communicator Communicator::duplicate(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  CUBELM_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  return Communicator(dup);
}

Communicator Communicator::split(int color, int key) const {
  CUBELM_ASSERT(comm_, "split of a null communicator");
  MPI_Comm part = MPI_COMM_NULL;
  CUBELM_MPI_CHECK(MPI_Comm_split(*comm_, color, key, &part));
  return Communicator(part);
}

} // namespace cubelm::comm
