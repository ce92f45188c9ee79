# Compiles cubelm through ccache when it is installed, so that a clean build
# of sources compiled before (a fresh clone, another build directory of the
# same variant) takes seconds instead of minutes. scripts/lib.sh points
# CCACHE_DIR at ~/.cache/cubelm/ccache for the scripts' builds.
#
# CUDA builds go without: Kokkos installs its launcher (kokkos_launch_compiler,
# then nvcc_wrapper) as the rule's launcher, in front of any compiler launcher,
# and ccache 4.7 behind nvcc_wrapper (as the nvcc it calls) reorders nvcc's
# "-Xcompiler ARG" pairs while preprocessing, so it cannot cache them.
option(CUBELM_CCACHE "Compile through ccache when it is installed (host builds; CUDA builds go without)" ON)
if(CUBELM_CCACHE AND NOT CUBELM_ENABLE_CUDA AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(CUBELM_CCACHE_PROGRAM ccache)
  if(CUBELM_CCACHE_PROGRAM)
    set(CMAKE_C_COMPILER_LAUNCHER "${CUBELM_CCACHE_PROGRAM}")
    set(CMAKE_CXX_COMPILER_LAUNCHER "${CUBELM_CCACHE_PROGRAM}")
    message(STATUS "cubelm: compiling through ${CUBELM_CCACHE_PROGRAM}")
  endif()
endif()
