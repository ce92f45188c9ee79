#include "cubelm/core/cpu.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdint>
#include <cstring>

namespace cubelm {

const char* isa_name(VectorIsa isa) {
  switch (isa) {
  case VectorIsa::avx512:
    return "AVX-512";
  case VectorIsa::avx2:
    return "AVX2";
  case VectorIsa::avx:
    return "AVX";
  case VectorIsa::none:
    break;
  }
  return "SSE";
}

VectorIsa CpuFeatures::isa() const {
  if (avx512)
    return VectorIsa::avx512;
  if (avx2)
    return VectorIsa::avx2;
  if (avx)
    return VectorIsa::avx;
  return VectorIsa::none;
}

std::string CpuFeatures::describe() const {
  if (vendor.empty())
    return "not x86-64";
  std::string out = vendor + " family " + std::to_string(family) + " model " +
                    std::to_string(model) + ", " + isa_name(isa());
  std::string extra;
  if (avx512_bf16)
    extra += "BF16";
  if (amx)
    extra += extra.empty() ? "AMX" : ", AMX";
  return extra.empty() ? out : out + " (" + extra + ")";
}

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0)
    return f;
  const unsigned max_leaf = a;
  char vendor[13] = {0};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;

  __cpuid(1, a, b, c, d);
  const int base_family = static_cast<int>((a >> 8) & 0xf);
  const int base_model = static_cast<int>((a >> 4) & 0xf);
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf)
                ? base_model + (static_cast<int>((a >> 16) & 0xf) << 4)
                : base_model;
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1, fma = (c >> 12) & 1;
  // Which register states the operating system saves on a context switch (XCR0):
  // SSE and AVX (bits 1, 2), AVX-512's opmask and ZMM (5, 6, 7), AMX tiles (17, 18).
  std::uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<std::uint64_t>(hi) << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6;
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;
  const bool tiles = (xcr0 & 0x60000) == 0x60000;
  f.avx = avx && ymm;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    const bool avx2 = (b >> 5) & 1;
    const bool avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1, avx512bw = (b >> 30) & 1,
               avx512vl = (b >> 31) & 1;
    const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    f.avx2 = f.avx && avx2 && fma;
    f.avx512 = f.avx2 && zmm && avx512f && avx512dq && avx512bw && avx512vl;
    f.amx = amx_bf16 && amx_tile && tiles;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __cpuid_count(7, 0, a1, b1, c1, d1);
    if (a1 >= 1) { // leaf 7 subleaf 1: AVX512_BF16 in EAX bit 5
      __cpuid_count(7, 1, a1, b1, c1, d1);
      f.avx512_bf16 = f.avx512 && ((a1 >> 5) & 1);
    }
  }
#endif
  return f;
}

} // namespace cubelm
