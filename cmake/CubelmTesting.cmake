# cubelm_add_mpi_test(NAME <name> SOURCES <files...> RANKS <n...> [LABELS <labels...>])
#
# Builds one GoogleTest program (linked with the MPI test main) and registers
# it with CTest once per rank count as <name>_<n>ranks, launched through
# MPIEXEC_EXECUTABLE with MPIEXEC_NUMPROC_FLAG and MPIEXEC_PREFLAGS. Every run
# gets OMP_NUM_THREADS=1 and may oversubscribe the cores (8 ranks on a laptop
# is normal); running as root is allowed for Open MPI, which refuses otherwise. Every
# model the tests run checks each piece's tensor-parallel collectives against their
# description (CUBELM_CHECK_COLLECTIVES, tp/collectives.hpp).

set(CUBELM_TEST_ENVIRONMENT
    CUBELM_CHECK_COLLECTIVES=1
    OMP_NUM_THREADS=1
    OMP_PROC_BIND=false
    OMPI_MCA_rmaps_base_oversubscribe=1
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe)

# In a CUDA build every test program runs its kernels and collectives on the GPU:
# label them `gpu` (scripts/gpu-check runs `ctest -L gpu`).
if(CUBELM_ENABLE_CUDA)
  set(CUBELM_DEVICE_LABEL gpu)
else()
  set(CUBELM_DEVICE_LABEL "")
endif()

function(cubelm_add_mpi_test)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;RANKS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  # The shared helpers (test_helpers.hpp, layouts.hpp, ...) sit in tests/, the tests in
  # its folders (tests/README.md).
  target_include_directories(${ARG_NAME} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${ARG_NAME} PRIVATE cubelm_mpi_test_main GTest::gtest)
  foreach(n IN LISTS ARG_RANKS)
    set(test_name ${ARG_NAME}_${n}ranks)
    add_test(NAME ${test_name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${ARG_NAME}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test_name} PROPERTIES
      ENVIRONMENT "${CUBELM_TEST_ENVIRONMENT}"
      PROCESSORS ${n}
      TIMEOUT 300
      LABELS "mpi;${CUBELM_DEVICE_LABEL};${ARG_LABELS}")
  endforeach()
endfunction()

# cubelm_add_mpi_test_run(NAME <name> SUFFIX <suffix> RANKS <n...> ENVIRONMENT <VAR=value...>)
#
# Runs the program of an earlier cubelm_add_mpi_test once more per rank count, as
# <name>_<suffix>_<n>ranks, with extra environment variables.
function(cubelm_add_mpi_test_run)
  cmake_parse_arguments(ARG "" "NAME;SUFFIX" "RANKS;ENVIRONMENT" ${ARGN})
  foreach(n IN LISTS ARG_RANKS)
    set(test_name ${ARG_NAME}_${ARG_SUFFIX}_${n}ranks)
    add_test(NAME ${test_name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${ARG_NAME}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test_name} PROPERTIES
      ENVIRONMENT "${CUBELM_TEST_ENVIRONMENT};${ARG_ENVIRONMENT}"
      PROCESSORS ${n}
      TIMEOUT 300
      LABELS "mpi;${CUBELM_DEVICE_LABEL}")
  endforeach()
endfunction()

# cubelm_add_cli_test(NAME <name> COMMAND <args...> [PASS <regex>] [FAIL <regex>] [WILL_FAIL])
#
# Runs the `cubelm` program (or any command) and checks its output.
function(cubelm_add_cli_test)
  cmake_parse_arguments(ARG "WILL_FAIL" "NAME;PASS;FAIL" "COMMAND" ${ARGN})
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_COMMAND})
  set_tests_properties(${ARG_NAME} PROPERTIES ENVIRONMENT "${CUBELM_TEST_ENVIRONMENT}"
                                              TIMEOUT 120 LABELS "cli")
  if(ARG_PASS)
    set_tests_properties(${ARG_NAME} PROPERTIES PASS_REGULAR_EXPRESSION "${ARG_PASS}")
  endif()
  if(ARG_FAIL)
    set_tests_properties(${ARG_NAME} PROPERTIES FAIL_REGULAR_EXPRESSION "${ARG_FAIL}")
  endif()
  if(ARG_WILL_FAIL)
    set_tests_properties(${ARG_NAME} PROPERTIES WILL_FAIL TRUE)
  endif()
endfunction()
