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

std::vector<int> Communicator::world_ranks() const {
  CUBELM_ASSERT(comm_, "world_ranks of a null communicator");
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  CUBELM_MPI_CHECK(MPI_Comm_group(*comm_, &mine));
  CUBELM_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(static_cast<std::size_t>(size_)), out(ranks.size());
  for (int r = 0; r < size_; ++r)
    ranks[static_cast<std::size_t>(r)] = r;
  CUBELM_MPI_CHECK(MPI_Group_translate_ranks(mine, size_, ranks.data(), world, out.data()));
  CUBELM_MPI_CHECK(MPI_Group_free(&mine));
  CUBELM_MPI_CHECK(MPI_Group_free(&world));
  for (int& r : out)
    if (r == MPI_UNDEFINED)
      r = -1;
  return out;
}

bool threads_may_call_mpi() {
  int level = MPI_THREAD_SINGLE;
  CUBELM_MPI_CHECK(MPI_Query_thread(&level));
  return level == MPI_THREAD_MULTIPLE;
}

std::string agree(const Communicator& comm, const std::string& local) {
  const int mine = local.empty() ? comm.size() : comm.rank();
  int first = comm.size();
  CUBELM_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm.raw()));
  if (first == comm.size())
    return "";
  int length = static_cast<int>(local.size());
  CUBELM_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, first, comm.raw()));
  std::string text =
      comm.rank() == first ? local : std::string(static_cast<std::size_t>(length), ' ');
  CUBELM_MPI_CHECK(MPI_Bcast(text.data(), length, MPI_CHAR, first, comm.raw()));
  return text;
}

std::string mpi_library() {
  char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  CUBELM_MPI_CHECK(MPI_Get_library_version(library, &length));
  return std::string(library, static_cast<std::size_t>(length));
}

std::string mpi_thread_hazard(const std::string& library) {
  if (library.rfind("Open MPI v6.0.0rc", 0) != 0)
    return "";
  return library.substr(0, library.find(',')) +
         " (a release candidate) hangs when two threads of a process communicate at once "
         "(docs/training.md#background-checkpoints); another Open MPI release or another MPI "
         "allows it";
}

std::string second_thread_problem(const Communicator& comm) {
  std::string problem;
  if (!threads_may_call_mpi())
    problem = "MPI does not run at MPI_THREAD_MULTIPLE";
  else
    problem = mpi_thread_hazard(mpi_library());
  return agree(comm, problem);
}

} // namespace cubelm::comm
