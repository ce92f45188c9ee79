# The layering of cubelm's source folders, checked: a file may include headers of
# its own folder and of the folders its layer lists below, nothing else
# (docs/architecture.md). Files of the Kokkos-free set must not reach a Kokkos
# header through any chain of cubelm includes.
#
#   cmake -DROOT=<source tree> -P cmake/CubelmLayers.cmake
#
# Prints every offending include as file:line and fails when there is one.

cmake_minimum_required(VERSION 3.21)

# The allowed matrix, written once: folder, then the folders it may include.
set(CUBELM_LAYERS
  "core:"
  "comm:core"
  "kernels:core"
  "pipeline:core"
  "tp:core comm kernels"
  "io:core comm"
  "cost:core comm pipeline tp io"
  "model:core comm kernels pipeline tp io cost"
  "train:core comm kernels pipeline tp io cost model"
  "app:core comm kernels pipeline tp io cost model train")

# Headers (and their whole include closure) that must stay free of Kokkos, so that
# deck validation, plans and memory estimates build and run without a device.
set(CUBELM_KOKKOS_FREE
  include/cubelm/core/config.hpp
  include/cubelm/core/devices.hpp
  include/cubelm/core/error.hpp
  include/cubelm/core/memory_info.hpp
  include/cubelm/core/random.hpp
  include/cubelm/core/stop.hpp
  include/cubelm/comm/devices.hpp
  include/cubelm/comm/layout.hpp
  include/cubelm/tp/collectives.hpp
  include/cubelm/tp/buffers.hpp
  include/cubelm/tp/shapes.hpp
  include/cubelm/io/deck.hpp
  include/cubelm/io/machine.hpp)
# Folders whose every header and source is Kokkos-free: the pipeline plans and the cost
# layer (sizes, memory, traffic, predictions, the planner) run on a login node.
set(CUBELM_KOKKOS_FREE_FOLDERS pipeline cost)

if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source tree> -P CubelmLayers.cmake")
endif()

set(folders "")
foreach(entry IN LISTS CUBELM_LAYERS)
  string(REPLACE ":" ";" parts "${entry}")
  list(GET parts 0 folder)
  list(LENGTH parts n)
  set(allowed_${folder} ${folder})
  if(n GREATER 1)
    list(GET parts 1 below)
    separate_arguments(below UNIX_COMMAND "${below}")
    list(APPEND allowed_${folder} ${below})
  endif()
  list(APPEND folders ${folder})
endforeach()

# The cubelm headers (folder/name.hpp) and system headers a file includes, with lines.
function(cubelm_includes file out_cubelm out_system)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include")
  set(cubelm "")
  set(system "")
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*\"cubelm/([^\"]+)\"")
      list(APPEND cubelm "${CMAKE_MATCH_1}")
    elseif(line MATCHES "#[ \t]*include[ \t]*<([^>]+)>")
      list(APPEND system "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out_cubelm} "${cubelm}" PARENT_SCOPE)
  set(${out_system} "${system}" PARENT_SCOPE)
endfunction()

# The line number of the first line of `file` that is `text`.
function(cubelm_line_of file text out)
  file(READ "${file}" content)
  string(FIND "${content}" "${text}" at)
  string(SUBSTRING "${content}" 0 ${at} before)
  string(REGEX MATCHALL "\n" newlines "${before}")
  list(LENGTH newlines n)
  math(EXPR n "${n} + 1")
  set(${out} ${n} PARENT_SCOPE)
endfunction()

set(problems 0)
set(checked 0)
foreach(folder IN LISTS folders)
  file(GLOB_RECURSE files RELATIVE "${ROOT}"
       "${ROOT}/include/cubelm/${folder}/*" "${ROOT}/src/${folder}/*")
  if(folder STREQUAL "app" AND EXISTS "${ROOT}/src/main.cpp")
    list(APPEND files src/main.cpp)
  endif()
  foreach(f IN LISTS files)
    if(NOT f MATCHES "\\.(hpp|cpp|h|hpp\\.in)$")
      continue()
    endif()
    math(EXPR checked "${checked} + 1")
    file(STRINGS "${ROOT}/${f}" includes REGEX "^[ \t]*#[ \t]*include")
    foreach(text IN LISTS includes)
      if(text MATCHES "^[ \t]*#[ \t]*include[ \t]*\"cubelm/([a-z_]+)/")
        set(target "${CMAKE_MATCH_1}")
        list(FIND allowed_${folder} "${target}" found)
        if(found EQUAL -1)
          cubelm_line_of("${ROOT}/${f}" "${text}" number)
          message("${f}:${number}: ${folder}/ includes a header of ${target}/ "
                  "(${folder} may include: ${allowed_${folder}})")
          math(EXPR problems "${problems} + 1")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

# The Kokkos-free headers and folders: follow cubelm includes, refuse any Kokkos header.
set(kokkos_free ${CUBELM_KOKKOS_FREE})
foreach(folder IN LISTS CUBELM_KOKKOS_FREE_FOLDERS)
  file(GLOB_RECURSE inside RELATIVE "${ROOT}" "${ROOT}/include/cubelm/${folder}/*.hpp"
       "${ROOT}/src/${folder}/*.cpp" "${ROOT}/src/${folder}/*.hpp")
  list(APPEND kokkos_free ${inside})
endforeach()
foreach(start IN LISTS kokkos_free)
  if(NOT EXISTS "${ROOT}/${start}")
    message("${start}: listed as Kokkos-free but missing")
    math(EXPR problems "${problems} + 1")
    continue()
  endif()
  set(queue "${start}")
  set(seen "")
  while(queue)
    list(POP_FRONT queue file)
    if(file IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${file}")
    if(NOT EXISTS "${ROOT}/${file}")
      continue() # generated (version.hpp)
    endif()
    cubelm_includes("${ROOT}/${file}" cubelm system)
    foreach(s IN LISTS system)
      if(s MATCHES "^(Kokkos|KokkosBlas|KokkosKernels|cuda|nccl)")
        message("${file}: includes <${s}>, but ${start} must stay free of Kokkos and CUDA")
        math(EXPR problems "${problems} + 1")
      endif()
    endforeach()
    foreach(c IN LISTS cubelm)
      list(APPEND queue "include/cubelm/${c}")
    endforeach()
  endwhile()
endforeach()

if(checked EQUAL 0)
  message(FATAL_ERROR "layers: no source files under ${ROOT}")
endif()
if(problems GREATER 0)
  message(FATAL_ERROR "layers: ${problems} include(s) break the layering")
endif()
message("layers: ${checked} files follow the layering")
