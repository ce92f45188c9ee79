// Proves an MPI installation end to end without a device: every rank starts,
// one all-reduce and one gather cross the processes, and rank 0 prints one line
//   mpi_probe: 2 ranks on 1 node (host), sum of ranks 1 (expected 1), Open MPI v4.1.4
// Exit status 0 only when the sum is right. The GPU bundle's run-checks uses it to
// show that the bundled mpiexec and Open MPI work where no GPU is (docs/launching.md).

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "mpi_probe: MPI_Init failed\n");
    return 1;
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long sum = 0;
  const long mine = rank;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);

  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  std::vector<char> hosts(rank == 0 ? static_cast<std::size_t>(size) * MPI_MAX_PROCESSOR_NAME : 1);
  MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
             0, MPI_COMM_WORLD);

  const long expected = static_cast<long>(size) * (size - 1) / 2;
  if (rank == 0) {
    std::set<std::string> nodes;
    for (int r = 0; r < size; ++r)
      nodes.insert(std::string(&hosts[static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME]));
    char library[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int chars = 0;
    MPI_Get_library_version(library, &chars);
    std::string lib(library, static_cast<std::size_t>(chars));
    lib = lib.substr(0, lib.find_first_of(",\n"));
    std::printf("mpi_probe: %d rank%s on %zu node%s (%s), sum of ranks %ld (expected %ld), %s\n",
                size, size == 1 ? "" : "s", nodes.size(), nodes.size() == 1 ? "" : "s", host, sum,
                expected, lib.c_str());
  }
  MPI_Finalize();
  return sum == expected ? 0 : 1;
}
