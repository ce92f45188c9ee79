#include "cubelm/core/environment.hpp"

#include "cubelm/core/devices.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/placement.hpp"

#include "device_table.hpp"
#include "node.hpp"

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace cubelm {

namespace {

bool is_kokkos_argument(const char* arg) {
  return std::strncmp(arg, "--kokkos-", 9) == 0;
}

#ifdef KOKKOS_ENABLE_CUDA
bool has_device_argument(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--kokkos-device-id", 18) == 0 ||
        std::strncmp(argv[i], "--kokkos-num-devices", 20) == 0 ||
        std::strncmp(argv[i], "--kokkos-map-device-id-by", 25) == 0)
      return true;
  return false;
}

// One GPU per rank on a node: node-local rank modulo the visible GPUs.
int pick_device() {
  const int local_rank = NodeComm().rank();
  int devices = 0;
  CUBELM_CUDA_CHECK(cudaGetDeviceCount(&devices));
  return devices > 0 ? local_rank % devices : 0;
}

// A CUDA build where some rank has no usable GPU (no driver, no device, a driver
// too old for the runtime): every rank learns it through one all-reduce, the
// lowest such rank says why, and the whole job ends with exit status 2 before
// Kokkos would abort each rank on its own with less to say.
void require_devices(int rank, int size) {
  std::string why;
  const int mine = usable_devices(&why) > 0 ? size : rank;
  int first_without = size;
  CUBELM_MPI_CHECK(MPI_Allreduce(&mine, &first_without, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first_without == size)
    return;
  if (rank == first_without) {
    std::fprintf(stderr,
                 "cubelm: rank %d: error: this is a CUDA build of cubelm and it finds no usable "
                 "GPU (%s); run it on a GPU node, or build the CPU variant (cmake --preset cpu)\n",
                 rank, why.c_str());
    std::fflush(stderr);
  }
  MPI_Finalize();
  std::exit(2);
}
#endif

// Every rank's GPU (core/devices.hpp), gathered once over the world: the node is
// the world rank of the first rank sharing this rank's memory, the GPU its PCI bus
// id, which is how NCCL tells GPUs apart ("Duplicate GPU detected" compares the
// bus ids of ranks on one host). The device number would not do: with a
// CUDA_VISIBLE_DEVICES of their own, ranks on different GPUs all use device 0.
std::vector<DeviceKey> gather_devices(int world_rank, int world_size) {
  struct Record {
    int node;
    int ordinal;
    char device[32];
    char host[64];
  };
  Record mine{};
  mine.node = world_rank;
  mine.ordinal = -1;
  {
    const NodeComm node; // ordered by world rank: local rank 0 is the node's first
    CUBELM_MPI_CHECK(MPI_Bcast(&mine.node, 1, MPI_INT, 0, node.raw()));
  }
#ifdef KOKKOS_ENABLE_CUDA
  CUBELM_CUDA_CHECK(cudaGetDevice(&mine.ordinal));
  CUBELM_CUDA_CHECK(
      cudaDeviceGetPCIBusId(mine.device, static_cast<int>(sizeof(mine.device)), mine.ordinal));
  mine.device[sizeof(mine.device) - 1] = '\0';
#endif
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  CUBELM_MPI_CHECK(MPI_Get_processor_name(host, &length));
  std::memcpy(mine.host, host,
              std::min(static_cast<std::size_t>(std::max(length, 0)), sizeof(mine.host) - 1));

  std::vector<Record> all(static_cast<std::size_t>(world_size));
  CUBELM_MPI_CHECK(MPI_Allgather(&mine, static_cast<int>(sizeof(Record)), MPI_BYTE, all.data(),
                                 static_cast<int>(sizeof(Record)), MPI_BYTE, MPI_COMM_WORLD));
  const auto text = [](const char* chars, std::size_t size) {
    return std::string(chars, std::find(chars, chars + size, '\0'));
  };
  std::vector<DeviceKey> devices(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    devices[r].node = all[r].node;
    devices[r].ordinal = all[r].ordinal;
    devices[r].device = text(all[r].device, sizeof(all[r].device));
    devices[r].node_name = text(all[r].host, sizeof(all[r].host));
  }
  return devices;
}

} // namespace

Environment::Environment(int& argc, char**& argv, bool threads_call_mpi) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Only the thread that calls MPI_Init talks to MPI (OpenMP threads never do), unless
    // a checkpoint writer thread is to write beside it (checkpoint.async).
    CUBELM_MPI_CHECK(MPI_Init_thread(&argc, &argv,
                                     threads_call_mpi ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                                     &thread_level_));
    owns_mpi_ = true;
  } else {
    CUBELM_MPI_CHECK(MPI_Query_thread(&thread_level_));
  }
  // Errors come back as codes so that CUBELM_MPI_CHECK can report rank and
  // file:line before aborting; communicators duplicated later inherit this.
  CUBELM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  CUBELM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  CUBELM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));

  launch_cpus_ = launch_cpus();

  if (!Kokkos::is_initialized()) {
    // Kokkos sees only its own --kokkos-* options: Kokkos 3.x also answers
    // unprefixed ones such as --help, which belong to the program.
    std::vector<char*> args{argv[0]};
    for (int i = 1; i < argc; ++i)
      if (is_kokkos_argument(argv[i]))
        args.push_back(argv[i]);
    std::string device_arg;
#ifdef KOKKOS_ENABLE_CUDA
    require_devices(rank_, size_);
    if (!has_device_argument(argc, argv)) {
      device_arg = "--kokkos-device-id=" + std::to_string(pick_device());
      args.push_back(device_arg.data());
    }
#endif
    // cubelm checks the placement of ranks and threads itself (placement_warnings, per
    // node and naming the remedy): Kokkos' own warnings (OMP_PROC_BIND not set, "likely
    // oversubscribing") would repeat on every rank, for layouts cubelm chose on purpose.
    static char no_warnings[] = "--kokkos-disable-warnings";
    args.push_back(no_warnings);
    int kargc = static_cast<int>(args.size());
    args.push_back(nullptr);
    char** kargv = args.data();
    Kokkos::initialize(kargc, kargv);
    owns_kokkos_ = true;
  }
  // Kokkos has read its --kokkos-* options; take them out of argv so that the
  // command-line parser of the program sees only its own.
  int kept = 1;
  for (int i = 1; i < argc; ++i)
    if (!is_kokkos_argument(argv[i]))
      argv[kept++] = argv[i];
  argc = kept;

  set_world_devices(gather_devices(rank_, size_));
}

std::vector<std::string> Environment::placement_warnings() const {
  const NodeComm node_ranks(rank_);
  const MPI_Comm node = node_ranks.raw();
  const int local = node_ranks.rank(), locals = node_ranks.size();

  // One record per rank: world rank, threads, pins, yields, CPU count, then the CPUs.
  constexpr int head = 5;
  std::vector<int> mine{rank_, static_cast<int>(Kokkos::DefaultHostExecutionSpace().concurrency()),
                        openmp_pins_threads() ? 1 : 0, mpi_yields_when_idle() ? 1 : 0,
                        static_cast<int>(launch_cpus_.size())};
  mine.insert(mine.end(), launch_cpus_.begin(), launch_cpus_.end());
  const int count = static_cast<int>(mine.size());
  std::vector<int> counts(local == 0 ? locals : 0), offsets(counts.size());
  CUBELM_MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, node));
  int total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = total;
    total += counts[i];
  }
  std::vector<int> all(static_cast<std::size_t>(total));
  CUBELM_MPI_CHECK(MPI_Gatherv(mine.data(), count, MPI_INT, all.data(), counts.data(),
                               offsets.data(), MPI_INT, 0, node));
  if (local != 0)
    return {};

  std::vector<RankPlacement> ranks;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const int* r = all.data() + offsets[i];
    RankPlacement p;
    p.rank = r[0];
    p.threads = r[1];
    p.pins_threads = r[2] != 0;
    p.yields = r[3] != 0;
    p.cpus.assign(r + head, r + head + r[4]);
    ranks.push_back(std::move(p));
  }
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  CUBELM_MPI_CHECK(MPI_Get_processor_name(host, &length));
  return cubelm::placement_warnings(ranks, std::string(host, static_cast<std::size_t>(length)));
}

Environment::~Environment() {
  if (owns_kokkos_ && Kokkos::is_initialized())
    Kokkos::finalize();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized)
    MPI_Finalize();
}

} // namespace cubelm
