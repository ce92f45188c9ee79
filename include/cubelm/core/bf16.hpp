#pragma once
/// \file
/// \brief bfloat16: the storage type of train.precision = "bf16" (docs/precision.md).
///
/// A bfloat16 is the upper half of a float: its sign, its 8 exponent bits and the top 7
/// bits of its mantissa. cubelm computes in float and stores or sends bfloat16; `bf16`
/// is that storage, two bytes with no arithmetic of its own, so that a Kokkos View or a
/// message of them is exactly what it holds.

#include <Kokkos_Macros.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cubelm {

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
  // Both results, then a select rather than a branch: loops of conversions vectorise.
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet = (u | 0x00400000u) >> 16; // NaN: sign and payload top kept
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/// \brief x rounded to bfloat16, as a float (the low 16 bits zero).
KOKKOS_INLINE_FUNCTION float bf16_round(float x) {
  return bits_float(static_cast<std::uint32_t>(bf16_bits(x)) << 16);
}

/// \brief A bfloat16 in memory: two bytes. It converts to float exactly and from float
/// by rounding (bf16_bits), implicitly, so that a kernel written for a storage type `T`
/// reads `compute_t<T> v = x(i)` and stores `y(i) = v` whatever T is; it has no
/// arithmetic of its own, so a sum can never be kept in it by accident (`y(i) += v`
/// does not compile).
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  /// \brief The bfloat16 nearest to `x` (bf16_bits).
  KOKKOS_INLINE_FUNCTION bf16(float x) : bits(bf16_bits(x)) {}
  /// \brief The float this bfloat16 is (exact).
  KOKKOS_INLINE_FUNCTION operator float() const { return value(); }

  /// \brief The bfloat16 nearest to `x` (bf16_bits).
  KOKKOS_INLINE_FUNCTION static bf16 from(float x) { return bf16(x); }
  /// \brief The float this bfloat16 is (exact).
  KOKKOS_INLINE_FUNCTION float value() const {
    return bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
};

static_assert(sizeof(bf16) == 2, "cubelm::bf16 must be two bytes");
static_assert(std::is_trivially_copyable_v<bf16>, "cubelm::bf16 must copy as its bytes");

/// \brief The type a kernel computes and sums values stored as `T` in, and the type of
/// the gradients and master weights of a model whose activations are `T`: float for
/// bf16 (and float), double for double.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

} // namespace cubelm
