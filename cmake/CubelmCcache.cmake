# Compiles cubelm through ccache when it is installed, so that a clean build
# of sources compiled before (a fresh clone, another build directory of the
# same variant) takes seconds instead of minutes. scripts/lib.sh points
# CCACHE_DIR at ~/.cache/cubelm/ccache for the scripts' builds.
#
# CUDA builds compile through Kokkos's nvcc_wrapper, which Kokkos installs as
# the rule's launcher; ccache would have to sit behind it, so they go without.
option(CUBELM_CCACHE "Compile through ccache when it is installed (host builds; CUDA builds go without)" ON)
if(CUBELM_CCACHE AND NOT CUBELM_ENABLE_CUDA AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(CUBELM_CCACHE_PROGRAM ccache)
  if(CUBELM_CCACHE_PROGRAM)
    set(CMAKE_C_COMPILER_LAUNCHER "${CUBELM_CCACHE_PROGRAM}")
    set(CMAKE_CXX_COMPILER_LAUNCHER "${CUBELM_CCACHE_PROGRAM}")
    message(STATUS "cubelm: compiling through ${CUBELM_CCACHE_PROGRAM}")
  endif()
endif()
