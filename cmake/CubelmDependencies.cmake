# Finds every third-party package cubelm builds against and checks that each
# one is the flavour we need (parallel HDF5, Kokkos with the right backend).

find_package(Kokkos 3.4 REQUIRED)
find_package(KokkosKernels REQUIRED)
include(CubelmKokkosKernels)
message(STATUS "cubelm: Kokkos ${Kokkos_VERSION} from ${Kokkos_DIR}")
message(STATUS "cubelm: KokkosKernels ${KokkosKernels_VERSION} from ${KokkosKernels_DIR}")

# A CUDA build of cubelm needs a CUDA build of Kokkos and the reverse: the
# default execution space decides where every View lives.
kokkos_check(DEVICES CUDA RETURN_VALUE cubelm_kokkos_has_cuda)
if(CUBELM_ENABLE_CUDA AND NOT cubelm_kokkos_has_cuda)
  message(FATAL_ERROR
    "CUBELM_ENABLE_CUDA=ON but the Kokkos found at ${Kokkos_DIR} has no CUDA backend. "
    "Point Kokkos_ROOT at a CUDA build of Kokkos (scripts/setup makes one when nvcc is present).")
endif()
if(NOT CUBELM_ENABLE_CUDA AND cubelm_kokkos_has_cuda)
  message(FATAL_ERROR
    "The Kokkos found at ${Kokkos_DIR} was built with CUDA; configure with CUBELM_ENABLE_CUDA=ON "
    "(cmake --preset cuda) or point Kokkos_ROOT at a host-only Kokkos.")
endif()

# One thread pool on CPUs: the BLAS must run its threads on the same OpenMP
# runtime as Kokkos, so that OMP_NUM_THREADS, OMP_PROC_BIND and OMP_PLACES place
# both (docs/performance.md). Kokkos Kernels links whatever libopenblas the system
# points at (on Debian the pthreads build by default, whose threads inherit the
# main thread's binding); cubelm links OpenBLAS built for OpenMP instead when it
# is installed (Debian: libopenblas-openmp-dev), or the library given here.
set(CUBELM_BLAS_LIBRARY "" CACHE FILEPATH
    "BLAS (and LAPACK) library linked instead of Kokkos Kernels' choice; empty: OpenBLAS built for OpenMP when found")
if(NOT CUBELM_BLAS_LIBRARY)
  find_library(CUBELM_OPENBLAS_OPENMP NAMES openblas
               PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
                     /usr/lib64/openblas-openmp /usr/lib/openblas-openmp
               NO_DEFAULT_PATH)
  if(CUBELM_OPENBLAS_OPENMP)
    set(CUBELM_BLAS_LIBRARY ${CUBELM_OPENBLAS_OPENMP})
  endif()
endif()
# cubelm::blas: the BLAS that cubelm (and perf/bench_train, which calls sgemm directly)
# links, whichever way Kokkos Kernels was packaged.
add_library(cubelm_blas INTERFACE)
add_library(cubelm::blas ALIAS cubelm_blas)
if(CUBELM_BLAS_LIBRARY)
  foreach(target Kokkos::BLAS Kokkos::LAPACK)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES ${CUBELM_BLAS_LIBRARY})
    endif()
  endforeach()
  target_link_libraries(cubelm_blas INTERFACE ${CUBELM_BLAS_LIBRARY})
  message(STATUS "cubelm: BLAS ${CUBELM_BLAS_LIBRARY}")
elseif(TARGET Kokkos::BLAS)
  target_link_libraries(cubelm_blas INTERFACE Kokkos::BLAS)
else()
  find_package(BLAS REQUIRED)
  target_link_libraries(cubelm_blas INTERFACE ${BLAS_LIBRARIES})
endif()
if(NOT CUBELM_BLAS_LIBRARY)
  message(STATUS "cubelm: BLAS as Kokkos Kernels found it (no OpenMP build of OpenBLAS found: "
                 "its threads and Kokkos' may compete; Debian: apt-get install libopenblas-openmp-dev)")
endif()

find_package(MPI REQUIRED COMPONENTS CXX)
# The hang watchdog of the comm layer runs on a thread of its own.
find_package(Threads REQUIRED)

# HDF5 must be the MPI-parallel build: checkpoints are written collectively.
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
include(CheckSymbolExists)
include(CMakePushCheckState)
cmake_push_check_state(RESET)
set(CMAKE_REQUIRED_INCLUDES ${HDF5_INCLUDE_DIRS} ${MPI_CXX_INCLUDE_DIRS})
set(CMAKE_REQUIRED_QUIET ON)
check_symbol_exists(H5_HAVE_PARALLEL "H5pubconf.h" CUBELM_HDF5_IS_PARALLEL)
cmake_pop_check_state()
if(NOT CUBELM_HDF5_IS_PARALLEL)
  message(FATAL_ERROR
    "The HDF5 found (${HDF5_INCLUDE_DIRS}) is a serial build: H5_HAVE_PARALLEL is not defined in "
    "H5pubconf.h. cubelm writes checkpoints collectively through MPI-IO and needs parallel HDF5 "
    "(Debian: libhdf5-openmpi-dev; modules: e.g. cray-hdf5-parallel). Set HDF5_ROOT to it.")
endif()
message(STATUS "cubelm: parallel HDF5 ${HDF5_VERSION} (${HDF5_INCLUDE_DIRS})")

find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)

if(CUBELM_ENABLE_CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()
if(CUBELM_ENABLE_NCCL)
  find_package(NCCL REQUIRED)
endif()

if(CUBELM_ENABLE_TESTS)
  find_package(GTest REQUIRED)
endif()
if(CUBELM_ENABLE_PERF)
  find_package(benchmark REQUIRED)
endif()
