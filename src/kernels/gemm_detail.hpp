#pragma once
// The bf16 path of kernels::gemm (precision.cpp). Internal to src/kernels.

#include "cubelm/kernels/views.hpp"

namespace cubelm::kernels::detail {

/// C = alpha op(A) op(B) + beta C with A and B rounded to bfloat16 and fp32
/// accumulation. Shapes are checked by the caller.
void bf16_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha, const Mat<float>& a,
               const Mat<float>& b, float beta, const Mat<float>& c);

} // namespace cubelm::kernels::detail
