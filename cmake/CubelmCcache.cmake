# Compiles cubelm through ccache when it is installed, so that a clean build
# of sources compiled before (a fresh clone, another build directory of the
# same variant) takes seconds instead of minutes. scripts/lib.sh points
# CCACHE_DIR at ~/.cache/cubelm/ccache and CCACHE_BASEDIR at the checkout for the
# scripts' builds (error reports then name sources relative to the build
# directory; core/error.cpp prints them from the checkout's top folder).
#
# CUDA builds compile through Kokkos's launcher (kokkos_launch_compiler, then
# nvcc_wrapper), which CMake puts in front of any compiler launcher, so ccache
# goes behind them instead: scripts/lib.sh's cubelm_cuda_path puts
# scripts/nvcc-ccache on PATH as the nvcc that nvcc_wrapper calls.
option(CUBELM_CCACHE "Compile through ccache when it is installed (CUDA builds: see scripts/nvcc-ccache)" ON)
if(CUBELM_CCACHE AND NOT CUBELM_ENABLE_CUDA AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(CUBELM_CCACHE_PROGRAM ccache)
  if(CUBELM_CCACHE_PROGRAM)
    set(CMAKE_C_COMPILER_LAUNCHER "${CUBELM_CCACHE_PROGRAM}")
    set(CMAKE_CXX_COMPILER_LAUNCHER "${CUBELM_CCACHE_PROGRAM}")
    message(STATUS "cubelm: compiling through ${CUBELM_CCACHE_PROGRAM}")
    # Debug information (the asan preset) names the checkout relative to its top, so
    # that ccache, with base_dir at the checkout (scripts/lib.sh), leaves the build
    # directory out of its hash and another clone's objects serve this one.
    add_compile_options("-fdebug-prefix-map=${CMAKE_SOURCE_DIR}=.")
  endif()
endif()
