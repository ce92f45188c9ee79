#pragma once
/// \file
/// \brief The arithmetic of matrix products (train.precision, docs/precision.md):
/// bfloat16 rounding, and the process-wide gemm precision that kernels::gemm follows.

#include "cubelm/core/bf16.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::kernels {

// The bfloat16 rounding (core/bf16.hpp), here too for the kernels' callers.
using cubelm::bf16_bits;
using cubelm::bf16_round;
using cubelm::bits_float;
using cubelm::float_bits;

/// \brief The precision of every float gemm from now on (Trainer sets the deck's):
/// fp32; tf32 (cuBLAS' TF32 tensor-op math in CUDA builds, fp32 on CPUs); bf16 (inputs
/// rounded to bfloat16, products accumulated in fp32: cuBLAS GemmEx on bf16 copies in
/// CUDA builds, rounded fp32 copies and sgemm on CPUs). Double gemms stay double.
void set_gemm_precision(Precision precision);
Precision gemm_precision();

/// \brief dst[i] = src[i] converted: float to bf16 rounds to nearest (bf16_bits), bf16 to
/// float is exact. The same length. S, D: (float, bf16) or (bf16, float).
template <class S, class D>
void convert(const ExecSpace& exec, const Vec<S>& src, const Vec<D>& dst);

} // namespace cubelm::kernels
