#[=======================================================================[.rst:
FindNCCL
--------

Finds the NVIDIA Collective Communications Library.

Hints: ``NCCL_ROOT`` (CMake or environment variable), ``NCCL_HOME``,
``CUDA_HOME``, the CUDA toolkit's own directories, and the ``nvidia-nccl-cu*``
Python wheel of the ``python3`` on PATH (``site-packages/nvidia/nccl``), which
ships ``libnccl.so.2`` without the unversioned link.

Result: the imported target ``NCCL::NCCL`` and ``NCCL_FOUND``,
``NCCL_INCLUDE_DIR``, ``NCCL_LIBRARY``, ``NCCL_VERSION``.
#]=======================================================================]

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} $ENV{CUDA_HOME})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
list(APPEND _nccl_hints /usr/local/cuda)
find_program(_nccl_python NAMES python3)
if(_nccl_python)
  execute_process(COMMAND ${_nccl_python} -c "import nvidia.nccl as n; print(n.__path__[0])"
                  OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_nccl_wheel)
    list(APPEND _nccl_hints ${_nccl_wheel})
  endif()
endif()

find_path(NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH +[0-9]+")
  string(REGEX REPLACE "[^0-9]*([0-9]+)$" "\\1" _nccl_major "${_nccl_major}")
  string(REGEX REPLACE "[^0-9]*([0-9]+)$" "\\1" _nccl_minor "${_nccl_minor}")
  string(REGEX REPLACE "[^0-9]*([0-9]+)$" "\\1" _nccl_patch "${_nccl_patch}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY _nccl_python)
