// Which BLAS kernels cubelm runs: the decision from given processors, kernel sets and
// environments (no test changes this machine's OPENBLAS_* variables), and the live
// answer of this process against its own processor.

#include "cubelm/core/cpu.hpp"
#include "cubelm/kernels/blas.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

using namespace cubelm;
using namespace cubelm::kernels;
using Action = BlasKernelDecision::Action;

namespace {

CpuFeatures intel(VectorIsa isa) {
  CpuFeatures f;
  f.vendor = "GenuineIntel";
  f.family = 6;
  f.model = 207;
  f.avx = isa >= VectorIsa::avx;
  f.avx2 = isa >= VectorIsa::avx2;
  f.avx512 = isa >= VectorIsa::avx512;
  return f;
}

CpuFeatures amd(VectorIsa isa) {
  CpuFeatures f = intel(isa);
  f.vendor = "AuthenticAMD";
  f.family = 25;
  return f;
}

BlasKernels openblas(const std::string& core, bool dynamic = true) {
  BlasKernels b;
  b.openblas = true;
  b.library = "OpenBLAS 0.3.21";
  b.core = core;
  b.dynamic = dynamic;
  return b;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST(BlasKernels, KernelSetsByTheirWidestInstructions) {
  bool known = false;
  EXPECT_EQ(openblas_core_isa("SkylakeX", &known), VectorIsa::avx512);
  EXPECT_TRUE(known);
  EXPECT_EQ(openblas_core_isa("cooperlake"), VectorIsa::avx512); // OpenBLAS ignores case
  EXPECT_EQ(openblas_core_isa("SapphireRapids"), VectorIsa::avx512);
  EXPECT_EQ(openblas_core_isa("Haswell"), VectorIsa::avx2);
  EXPECT_EQ(openblas_core_isa("Zen"), VectorIsa::avx2);
  EXPECT_EQ(openblas_core_isa("Sandybridge"), VectorIsa::avx);
  EXPECT_EQ(openblas_core_isa("Prescott", &known), VectorIsa::none);
  EXPECT_TRUE(known);
  EXPECT_EQ(openblas_core_isa("Nehalem"), VectorIsa::none);
  openblas_core_isa("Zen5", &known);
  EXPECT_FALSE(known);
}

TEST(BlasKernels, TheKernelSetThatFitsEachProcessor) {
  EXPECT_EQ(openblas_coretype_for(intel(VectorIsa::avx512)), "SkylakeX");
  EXPECT_EQ(openblas_coretype_for(amd(VectorIsa::avx512)), "SkylakeX");
  EXPECT_EQ(openblas_coretype_for(intel(VectorIsa::avx2)), "Haswell");
  EXPECT_EQ(openblas_coretype_for(amd(VectorIsa::avx2)), "Zen");
  EXPECT_EQ(openblas_coretype_for(intel(VectorIsa::avx)), "Sandybridge");
  EXPECT_EQ(openblas_coretype_for(intel(VectorIsa::none)), "");
}

// Debian's OpenBLAS 0.3.21 on an AVX-512 Xeon it does not know: Prescott, SSE only.
TEST(BlasKernels, KernelsBelowTheProcessorRestartWithTheRightOnes) {
  const auto d =
      decide_blas_kernels(intel(VectorIsa::avx512), openblas("Prescott"), nullptr, nullptr);
  EXPECT_EQ(d.action, Action::restart);
  EXPECT_EQ(d.coretype, "SkylakeX");
  EXPECT_TRUE(d.warning.empty());
  const auto z = decide_blas_kernels(amd(VectorIsa::avx2), openblas("Nehalem"), nullptr, nullptr);
  EXPECT_EQ(z.action, Action::restart);
  EXPECT_EQ(z.coretype, "Zen");
  const auto h =
      decide_blas_kernels(intel(VectorIsa::avx512), openblas("Haswell"), nullptr, nullptr);
  EXPECT_EQ(h.action, Action::restart);
  EXPECT_EQ(h.coretype, "SkylakeX");
}

TEST(BlasKernels, KernelsThatFitAreKept) {
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    const auto d = decide_blas_kernels(intel(VectorIsa::avx512), openblas(core), nullptr, nullptr);
    EXPECT_EQ(d.action, Action::keep) << core;
    EXPECT_TRUE(d.warning.empty()) << core;
    EXPECT_TRUE(has(d.note, std::string(core) + " kernels (AVX-512, as the processor")) << d.note;
  }
  // Kernels above the processor's widest instructions are the BLAS' business.
  EXPECT_EQ(
      decide_blas_kernels(intel(VectorIsa::avx2), openblas("SkylakeX"), nullptr, nullptr).action,
      Action::keep);
}

TEST(BlasKernels, AfterTheRestartTheNoteSaysWhoChose) {
  const auto d =
      decide_blas_kernels(intel(VectorIsa::avx512), openblas("SkylakeX"), "SkylakeX", "Prescott");
  EXPECT_EQ(d.action, Action::keep);
  EXPECT_TRUE(d.warning.empty());
  EXPECT_TRUE(has(d.note, "OPENBLAS_CORETYPE=SkylakeX set by cubelm")) << d.note;
  EXPECT_TRUE(has(d.note, "alone chose Prescott")) << d.note;
  // The BLAS ignored the variable: no second restart, a warning naming what to do.
  const auto n =
      decide_blas_kernels(intel(VectorIsa::avx512), openblas("Prescott"), "SkylakeX", "Prescott");
  EXPECT_EQ(n.action, Action::keep);
  EXPECT_TRUE(has(n.warning, "did not take OPENBLAS_CORETYPE=SkylakeX")) << n.warning;
  EXPECT_TRUE(has(n.note, "BELOW this AVX-512 processor")) << n.note;
}

// A value the environment already sets is always kept (some machines need it): the
// warning says what it costs and what would fit.
TEST(BlasKernels, TheUsersSettingIsKept) {
  const auto d =
      decide_blas_kernels(intel(VectorIsa::avx512), openblas("Prescott"), "Prescott", nullptr);
  EXPECT_EQ(d.action, Action::keep);
  EXPECT_TRUE(has(d.note, "OPENBLAS_CORETYPE=Prescott from the environment, kept")) << d.note;
  EXPECT_TRUE(has(d.warning, "environment sets OPENBLAS_CORETYPE=Prescott")) << d.warning;
  EXPECT_TRUE(has(d.warning, "set OPENBLAS_CORETYPE=SkylakeX")) << d.warning;
  const auto fit =
      decide_blas_kernels(intel(VectorIsa::avx2), openblas("Haswell"), "Haswell", nullptr);
  EXPECT_EQ(fit.action, Action::keep);
  EXPECT_TRUE(fit.warning.empty());
  EXPECT_TRUE(has(fit.note, "OPENBLAS_CORETYPE=Haswell from the environment")) << fit.note;
}

TEST(BlasKernels, ABlasBuiltForOneKernelSetCannotBeToldOtherwise) {
  const auto d =
      decide_blas_kernels(intel(VectorIsa::avx512), openblas("Prescott", false), nullptr, nullptr);
  EXPECT_EQ(d.action, Action::keep);
  EXPECT_TRUE(has(d.warning, "no DYNAMIC_ARCH")) << d.warning;
  EXPECT_TRUE(has(d.warning, "CUBELM_BLAS_LIBRARY")) << d.warning;
}

TEST(BlasKernels, OtherBlasLibrariesAndProcessorsAreLeftAlone) {
  const auto other = decide_blas_kernels(intel(VectorIsa::avx512), BlasKernels{}, nullptr, nullptr);
  EXPECT_EQ(other.action, Action::keep);
  EXPECT_TRUE(other.warning.empty());
  EXPECT_TRUE(has(other.note, "not OpenBLAS")) << other.note;
  const auto arm = decide_blas_kernels(CpuFeatures{}, openblas("NEOVERSEV1"), nullptr, nullptr);
  EXPECT_EQ(arm.action, Action::keep);
  EXPECT_EQ(arm.note, "NEOVERSEV1 kernels");
  const auto newer =
      decide_blas_kernels(intel(VectorIsa::avx512), openblas("GraniteRapids"), nullptr, nullptr);
  EXPECT_EQ(newer.action, Action::keep);
  EXPECT_TRUE(newer.warning.empty());
}

// This process, as it runs: the processor's features are consistent, and the decision
// for its own BLAS either keeps kernels at the processor's level or names the ones
// that fit (this test program does not restart itself; cubelm does).
TEST(BlasKernels, ThisProcess) {
  const CpuFeatures cpu = cpu_features();
  if (!cpu.vendor.empty()) {
    EXPECT_TRUE(!cpu.avx512 || cpu.avx2);
    EXPECT_TRUE(!cpu.avx2 || cpu.avx);
    EXPECT_FALSE(cpu.describe().empty());
  }
  const BlasKernels blas = blas_kernels();
  const auto d = blas_kernel_decision();
  if (d.action == Action::restart) {
    EXPECT_EQ(d.coretype, openblas_coretype_for(cpu));
    EXPECT_LT(openblas_core_isa(blas.core), cpu.isa());
  } else if (blas.openblas && !cpu.vendor.empty() && d.warning.empty()) {
    bool known = false;
    const VectorIsa runs = openblas_core_isa(blas.core, &known);
    EXPECT_TRUE(!known || runs >= cpu.isa()) << d.note;
  }
  std::printf("this process: %s; %s, %s\n", cpu.describe().c_str(), blas.library.c_str(),
              d.note.c_str());
}

// The kernels' instruction set (CUBELM_CPU_ARCH) against processors that have it and
// ones that do not; this machine runs what was built on it.
TEST(KernelIsa, ABuildForWiderInstructionsIsRefusedWithAMessage) {
  const VectorIsa built = kernels_built_isa();
  EXPECT_TRUE(kernels_isa_mismatch(intel(VectorIsa::avx512)).empty());
  EXPECT_TRUE(kernels_isa_mismatch(CpuFeatures{}).empty()); // not x86-64: nothing to compare
  if (built > VectorIsa::none) {
    const std::string why = kernels_isa_mismatch(intel(VectorIsa::none));
    EXPECT_TRUE(has(why, std::string("built for ") + isa_name(built))) << why;
    EXPECT_TRUE(has(why, "CUBELM_CPU_ARCH")) << why;
  }
  EXPECT_TRUE(kernels_isa_mismatch(cpu_features()).empty());
  std::printf("kernels built for %s\n", isa_name(built));
}
