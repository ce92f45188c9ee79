#include "cubelm/core/memory_check.hpp"

#include "node.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/core/memory_info.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#ifdef CUBELM_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace cubelm {

namespace {

bool skip_requested() {
  const char* v = std::getenv(kSkipMemoryCheck);
  return v != nullptr && std::strcmp(v, "0") != 0 && *v != '\0';
}

// The ranks of this node (they share its memory), split further by `color`.
int ranks_sharing(int color) {
  const NodeComm node;
  MPI_Comm same = MPI_COMM_NULL;
  CUBELM_MPI_CHECK(MPI_Comm_split(node.raw(), color, 0, &same));
  int size = 1;
  CUBELM_MPI_CHECK(MPI_Comm_size(same, &size));
  CUBELM_MPI_CHECK(MPI_Comm_free(&same));
  return size;
}

} // namespace

std::uint64_t usable_memory(std::uint64_t available) {
  return static_cast<std::uint64_t>(static_cast<double>(available) * (1.0 - kMemoryReserve));
}

MemoryCheck check_memory(std::uint64_t need) {
  int skip = skip_requested() ? 1 : 0;
  CUBELM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &skip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  MemoryCheck check;
  if (skip) {
    check.skipped = true;
    return check;
  }

  // What this rank may take.
  std::uint64_t available = 0;
  std::string source;
#ifdef CUBELM_ENABLE_CUDA
  int device = 0;
  std::size_t free_bytes = 0, total_bytes = 0;
  CUBELM_CUDA_CHECK(cudaGetDevice(&device));
  CUBELM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int sharing = ranks_sharing(device);
  available = static_cast<std::uint64_t>(free_bytes) / static_cast<std::uint64_t>(sharing);
  source = "free memory of GPU " + std::to_string(device) + " (" +
           format_bytes(static_cast<double>(free_bytes)) + " of " +
           format_bytes(static_cast<double>(total_bytes)) + ")";
#else
  const HostMemory host = read_host_memory();
  const int sharing = ranks_sharing(0);
  // Nothing readable (not Linux): no limit known, nothing to refuse.
  available = host.available().value_or(std::numeric_limits<std::uint64_t>::max()) /
              static_cast<std::uint64_t>(sharing);
  source = "host memory (" + host.describe() + ")";
#endif

  // The rank with the least room: the largest need / usable.
  const std::uint64_t usable = usable_memory(available);
  struct {
    double ratio;
    int rank;
  } worst{usable > 0 ? static_cast<double>(need) / static_cast<double>(usable)
                     : std::numeric_limits<double>::max(),
          0};
  CUBELM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &worst.rank));
  CUBELM_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD));

  // That rank's numbers and the source of its figure, for the message on every rank.
  unsigned long long numbers[4] = {need, available, usable,
                                   static_cast<unsigned long long>(sharing)};
  CUBELM_MPI_CHECK(MPI_Bcast(numbers, 4, MPI_UNSIGNED_LONG_LONG, worst.rank, MPI_COMM_WORLD));
  char text[256] = {0};
  std::strncpy(text, source.c_str(), sizeof(text) - 1);
  CUBELM_MPI_CHECK(MPI_Bcast(text, sizeof(text), MPI_CHAR, worst.rank, MPI_COMM_WORLD));

  check.rank = worst.rank;
  check.need = numbers[0];
  check.available = numbers[1];
  check.usable = numbers[2];
  check.sharing = static_cast<int>(numbers[3]);
  check.source = text;
  check.fits = check.need <= check.usable;
  return check;
}

} // namespace cubelm
