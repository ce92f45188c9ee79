#pragma once
/// \file
/// \brief What the processor can run: its vendor and the vector instruction sets
/// that both it and the operating system support (CPUID and XGETBV on x86-64).
///
/// cubelm asks so that the BLAS never runs kernels below the processor
/// (kernels/blas.hpp, docs/launching.md#blas-kernels): Debian's OpenBLAS 0.3.21
/// falls back to its oldest x86-64 kernels on processor models newer than itself.

#include <string>

namespace cubelm {

/// \brief The widest vector instructions a processor runs, in order.
enum class VectorIsa { none = 0, avx = 1, avx2 = 2, avx512 = 3 };

/// \brief "AVX-512", "AVX2", "AVX" or "SSE only".
const char* isa_name(VectorIsa isa);

/// \brief The features of this processor that decide which BLAS kernels fit it.
struct CpuFeatures {
  std::string vendor;  ///< "GenuineIntel", "AuthenticAMD", ...; empty off x86-64
  int family = 0;      ///< display family (CPUID leaf 1, with the extended family)
  int model = 0;       ///< display model (with the extended model)
  bool avx = false;    ///< AVX, and the OS saves the YMM state
  bool avx2 = false;   ///< AVX2 and FMA3, with AVX
  bool avx512 = false; ///< AVX-512 F, BW, DQ and VL, and the OS saves the ZMM state
  bool avx512_bf16 = false;
  bool amx = false; ///< AMX tiles (AMX-BF16)

  /// \brief The widest of avx512, avx2, avx that is set.
  VectorIsa isa() const;
  /// \brief e.g. "GenuineIntel family 6 model 207, AVX-512 (BF16, AMX)".
  std::string describe() const;
};

/// \brief This processor's features; all false (and an empty vendor) where the
/// processor is not x86-64.
CpuFeatures cpu_features();

} // namespace cubelm
