#pragma once
/// \file
/// \brief View types of the single-device kernels, templated on the scalar
/// (float for training, double for finite-difference tests).

#include "cubelm/core/bf16.hpp"
#include "cubelm/core/types.hpp"

#include <cstdint>
#include <type_traits>

namespace cubelm::kernels {

using cubelm::bf16;
using cubelm::compute_t;

/// \brief True where kernels run on the host's cores (OpenMP, Serial), false on a GPU.
constexpr bool kOnHost = std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>;

template <class T>
using Mat = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
template <class T>
using Vec = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;
/// \brief [B, heads, T, T] attention probabilities (or their gradients).
template <class T>
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, MemSpace>;
/// \brief Token ids (inputs or targets), one per row of the activations.
using Tokens = Kokkos::View<std::int32_t*, Kokkos::LayoutRight, MemSpace>;

} // namespace cubelm::kernels
