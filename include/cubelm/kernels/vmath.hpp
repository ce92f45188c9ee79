#pragma once
/// \file
/// \brief exp and tanh for the kernels' inner loops.
///
/// On GPUs and for doubles they are the math library's (kmath). For floats on CPUs
/// they are written out here, branch-free and without calls, so that the compiler
/// vectorises the loops of the softmax, the cross-entropy and GELU: libm's expf and
/// tanhf are calls, one element at a time, and were the largest cost of a CPU step
/// after the products (docs/kernels.md).

#include "cubelm/core/compat.hpp"
#include "cubelm/kernels/precision.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>
#include <type_traits>

namespace cubelm::kernels {

/// \brief e^x in float within 2 ulp of the exact value for normal results: x = n ln2 + r
/// with |r| <= ln2 / 2 (ln2 split in two for an exact product n ln2), e^r by its
/// degree-6 minimax polynomial (the coefficients of Cephes' expf), times 2^n built
/// from the exponent bits in two halves, so that subnormal results and n up to 254
/// stay exact. 0 below -104 (e^x underflows), +inf above 89 (it overflows), NaN
/// for NaN.
KOKKOS_INLINE_FUNCTION float exp_cpu(float x) {
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick: the sum's low
  // mantissa bits hold n, and no float-to-int conversion is needed.
  constexpr float kRound = 12582912.0f;
  const float shifted = xc * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const std::int32_t ni = static_cast<std::int32_t>(float_bits(shifted)) -
                          static_cast<std::int32_t>(float_bits(kRound));
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  const float p = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                      4.1665795894e-2f) *
                         r +
                     1.6666665459e-1f) *
                        r +
                    5.0000001201e-1f) *
                       r * r +
                   r) +
                  1.0f;
  const std::int32_t half = ni >> 1;
  const float s1 = bits_float(static_cast<std::uint32_t>(half + 127) << 23);
  const float s2 = bits_float(static_cast<std::uint32_t>(ni - half + 127) << 23);
  const float e = p * s1 * s2;
  return x < -104.0f ? 0.0f : (x > 89.0f ? bits_float(0x7f800000u) : e);
}

/// \brief e^x: exp_cpu for floats on CPUs, the math library's otherwise.
template <class T>
KOKKOS_INLINE_FUNCTION T exp_of(T x) {
  if constexpr (kOnHost && std::is_same_v<T, float>)
    return exp_cpu(x);
  else
    return kmath::exp(x);
}

/// \brief tanh(x): (1 - e) / (1 + e) with e = e^(-2|x|) <= 1 and the sign of x, for floats on
/// CPUs (within a few ulp of 1 in absolute terms, which is what GELU's 1 + tanh needs);
/// the math library's otherwise.
template <class T>
KOKKOS_INLINE_FUNCTION T tanh_of(T x) {
  if constexpr (kOnHost && std::is_same_v<T, float>) {
    const float ax = x < 0.0f ? -x : x;
    const float e = exp_cpu(-2.0f * ax);
    const float t = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -t : t;
  } else {
    return kmath::tanh(x);
  }
}

} // namespace cubelm::kernels
