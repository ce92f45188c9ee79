#pragma once
/// \file
/// \brief Execution/memory spaces, scalar type and View aliases used across cubelm.

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace cubelm {

/// \brief Where kernels run: Cuda in a CUDA build, OpenMP (or Serial) otherwise.
using ExecSpace = Kokkos::DefaultExecutionSpace;
/// \brief Memory space of model tensors.
using MemSpace = ExecSpace::memory_space;
/// \brief Host execution space for staging and I/O.
using HostExecSpace = Kokkos::DefaultHostExecutionSpace;
/// \brief Host memory that copies queued on an execution instance read from or write
/// to: page-locked (pinned) on CUDA, so that an asynchronous copy runs on the stream
/// without the driver staging it through a buffer of its own; plain host memory
/// otherwise.
#ifdef KOKKOS_ENABLE_CUDA
using PinnedHostSpace = Kokkos::CudaHostPinnedSpace;
#else
using PinnedHostSpace = Kokkos::HostSpace;
#endif

/// \brief Scalar type of model parameters, activations and gradients.
using real = float;

template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
template <class T>
using HostView1 = Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace>;
template <class T>
using HostView2 = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>;

} // namespace cubelm
