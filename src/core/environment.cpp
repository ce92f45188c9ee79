#include "cubelm/core/environment.hpp"

#include "cubelm/core/error.hpp"

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdio>
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
  MPI_Comm node = MPI_COMM_NULL;
  CUBELM_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local_rank = 0;
  CUBELM_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  CUBELM_MPI_CHECK(MPI_Comm_free(&node));
  int devices = 0;
  CUBELM_CUDA_CHECK(cudaGetDeviceCount(&devices));
  return devices > 0 ? local_rank % devices : 0;
}
#endif

} // namespace

Environment::Environment(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Only the thread that calls MPI_Init talks to MPI: OpenMP threads never do.
    CUBELM_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &thread_level_));
    owns_mpi_ = true;
  } else {
    CUBELM_MPI_CHECK(MPI_Query_thread(&thread_level_));
  }
  // Errors come back as codes so that CUBELM_MPI_CHECK can report rank and
  // file:line before aborting; communicators duplicated later inherit this.
  CUBELM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  CUBELM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  CUBELM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));

  if (!Kokkos::is_initialized()) {
    // Kokkos sees only its own --kokkos-* options: Kokkos 3.x also answers
    // unprefixed ones such as --help, which belong to the program.
    std::vector<char*> args{argv[0]};
    for (int i = 1; i < argc; ++i)
      if (is_kokkos_argument(argv[i]))
        args.push_back(argv[i]);
    std::string device_arg;
#ifdef KOKKOS_ENABLE_CUDA
    if (!has_device_argument(argc, argv)) {
      device_arg = "--kokkos-device-id=" + std::to_string(pick_device());
      args.push_back(device_arg.data());
    }
#endif
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
