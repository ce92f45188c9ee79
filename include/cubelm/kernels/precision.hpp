#pragma once
/// \file
/// \brief The arithmetic of matrix products (train.precision, docs/precision.md):
/// bfloat16 rounding, and the process-wide gemm precision that kernels::gemm follows.

#include "cubelm/core/config.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>
#include <cstring>

namespace cubelm::kernels {

/// \brief The bits of a float.
KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

/// \brief The float with these bits.
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

/// \brief The upper 16 bits of `x` rounded to nearest, ties to even: the bfloat16 nearest
/// to x. Infinities stay infinite, a NaN stays a NaN (made quiet, sign kept), finite
/// values too large round to infinity, subnormals round like every other value.
KOKKOS_INLINE_FUNCTION std::uint16_t bf16_bits(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep sign and payload top, set the quiet bit
    return static_cast<std::uint16_t>((u | 0x00400000u) >> 16);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// \brief x rounded to bfloat16, as a float (the low 16 bits zero).
KOKKOS_INLINE_FUNCTION float bf16_round(float x) {
  return bits_float(static_cast<std::uint32_t>(bf16_bits(x)) << 16);
}

/// \brief The precision of every float gemm from now on (Trainer sets the deck's):
/// fp32; tf32 (cuBLAS' TF32 tensor-op math in CUDA builds, fp32 on CPUs); bf16 (inputs
/// rounded to bfloat16, products accumulated in fp32: cuBLAS GemmEx on bf16 copies in
/// CUDA builds, rounded fp32 copies and sgemm on CPUs). Double gemms stay double.
void set_gemm_precision(Precision precision);
Precision gemm_precision();

/// \brief dst = src rounded to bfloat16 element by element (same shape; dst may be src).
void round_to_bf16(const ExecSpace& exec, const Mat<float>& src, const Mat<float>& dst);

} // namespace cubelm::kernels
