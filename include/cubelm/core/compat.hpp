#pragma once
/// \file
/// \brief Every Kokkos version guard of cubelm lives here (Kokkos 3.4 ... 5.x).
///
/// Each guard says when it can go. Compare KOKKOS_VERSION numerically:
/// KOKKOS_VERSION_GREATER_EQUAL only exists from 4.0 on.

#include <Kokkos_Core.hpp>

#if __has_include(<KokkosKernels_config.h>)
#include <KokkosKernels_config.h>
#endif

#include <string>
#include <type_traits>

// Kokkos Kernels 3.6 added KokkosBlas::gemm(exec, ...) (and KOKKOSKERNELS_VERSION);
// 3.4 and 3.5 run gemm on the default instance. Drop when 3.x support ends.
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 30600
#define CUBELM_KOKKOSBLAS_GEMM_ON_INSTANCE 1
#else
#define CUBELM_KOKKOSBLAS_GEMM_ON_INSTANCE 0
#endif

namespace cubelm::kmath {

// Kokkos 3.7 moved the math functions from Kokkos::Experimental to Kokkos and
// 4.3 removed the old names. Drop this branch when 3.x support ends.
#if KOKKOS_VERSION >= 30700
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

} // namespace cubelm::kmath

namespace cubelm::compat {

/// \brief "major.minor.patch" of the Kokkos cubelm was compiled against.
inline std::string kokkos_version_string() {
  // KOKKOS_VERSION is major*10000 + minor*100 + patch in every supported release.
  const int v = KOKKOS_VERSION;
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
         std::to_string(v % 100);
}

/// \brief True for execution spaces that run their work in order on a native stream
/// (CUDA): communication is ordered against them with events instead of fences.
template <class Exec>
struct stream_ordered : std::false_type {};
#ifdef KOKKOS_ENABLE_CUDA
template <>
struct stream_ordered<Kokkos::Cuda> : std::true_type {};
#endif

/// \brief The native stream of an execution space instance, or nullptr on host spaces.
///
/// Collectives on device memory (NCCL) are enqueued on this stream, or ordered
/// after it by an event, so that they follow the Kokkos kernels of the same
/// instance.
template <class Exec>
void* native_stream(const Exec& exec) {
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same_v<Exec, Kokkos::Cuda>) {
    return static_cast<void*>(exec.cuda_stream());
  }
#endif
  (void)exec;
  return nullptr;
}

} // namespace cubelm::compat
