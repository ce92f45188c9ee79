// Which kernels the BLAS runs, and making sure they fit the processor
// (kernels/blas.hpp, docs/launching.md#blas-kernels).

#include "cubelm/core/placement.hpp"
#include "cubelm/kernels/blas.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cubelm::kernels {

namespace {

// Set by cubelm before it restarts itself: the kernel set the BLAS chose alone.
constexpr const char* kChosenAlone = "CUBELM_BLAS_CHOSE";
constexpr const char* kCoretype = "OPENBLAS_CORETYPE";

struct CoreIsa {
  const char* name;
  VectorIsa isa;
};

// OpenBLAS' x86-64 kernel sets (driver/others/dynamic.c), by the widest vector
// instructions their kernels use.
constexpr CoreIsa kCores[] = {
    {"SapphireRapids", VectorIsa::avx512},
    {"Cooperlake", VectorIsa::avx512},
    {"SkylakeX", VectorIsa::avx512},
    {"Haswell", VectorIsa::avx2},
    {"Zen", VectorIsa::avx2},
    {"Excavator", VectorIsa::avx2},
    {"Sandybridge", VectorIsa::avx},
    {"Bulldozer", VectorIsa::avx},
    {"Piledriver", VectorIsa::avx},
    {"Steamroller", VectorIsa::avx},
    {"Prescott", VectorIsa::none},
    {"Katmai", VectorIsa::none},
    {"Coppermine", VectorIsa::none},
    {"Northwood", VectorIsa::none},
    {"Banias", VectorIsa::none},
    {"Atom", VectorIsa::none},
    {"Core2", VectorIsa::none},
    {"Penryn", VectorIsa::none},
    {"Dunnington", VectorIsa::none},
    {"Nehalem", VectorIsa::none},
    {"Athlon", VectorIsa::none},
    {"Opteron", VectorIsa::none},
    {"Opteron_SSE3", VectorIsa::none},
    {"Barcelona", VectorIsa::none},
    {"Nano", VectorIsa::none},
    {"Bobcat", VectorIsa::none},
};

bool same_name(const std::string& a, const char* b) {
  return a.size() == std::strlen(b) && strncasecmp(a.c_str(), b, a.size()) == 0;
}

std::string kernels_of(const std::string& core, VectorIsa isa) {
  return core + " (" + isa_name(isa) + " kernels)";
}

} // namespace

VectorIsa kernels_built_isa() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
  return VectorIsa::avx512;
#elif defined(__AVX2__) && defined(__FMA__)
  return VectorIsa::avx2;
#elif defined(__AVX__)
  return VectorIsa::avx;
#else
  return VectorIsa::none;
#endif
}

std::string kernels_isa_mismatch(const CpuFeatures& cpu) {
  const VectorIsa built = kernels_built_isa();
  if (cpu.vendor.empty() || built <= cpu.isa())
    return "";
  return std::string("this cubelm was built for ") + isa_name(built) +
         " processors (CMake CUBELM_CPU_ARCH=" + CUBELM_CPU_ARCH_NAME + "), and this one (" +
         cpu.describe() + ") does not have those instructions. Build cubelm on this machine " +
         "(scripts/run and the cpu preset do), or with -DCUBELM_CPU_ARCH= for any x86-64 " +
         "processor (docs/kernels.md#instruction-sets).";
}

BlasKernels blas_kernels() {
  BlasKernels out;
  using Text = char* (*)();
  const auto corename = reinterpret_cast<Text>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const auto config = reinterpret_cast<Text>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (corename == nullptr || config == nullptr)
    return out;
  out.openblas = true;
  out.core = corename();
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY USE_OPENMP Cooperlake MAX_THREADS=64"
  const std::string text = config();
  out.library = text.substr(0, text.find(' ', text.find(' ') + 1));
  out.dynamic = (" " + text + " ").find(" DYNAMIC_ARCH ") != std::string::npos;
  return out;
}

VectorIsa openblas_core_isa(const std::string& core, bool* known) {
  for (const CoreIsa& c : kCores)
    if (same_name(core, c.name)) {
      if (known)
        *known = true;
      return c.isa;
    }
  if (known)
    *known = false;
  return VectorIsa::none;
}

std::string openblas_coretype_for(const CpuFeatures& cpu) {
  switch (cpu.isa()) {
  case VectorIsa::avx512:
    return "SkylakeX";
  case VectorIsa::avx2:
    return cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine" ? "Zen" : "Haswell";
  case VectorIsa::avx:
    return "Sandybridge";
  case VectorIsa::none:
    break;
  }
  return "";
}

BlasKernelDecision decide_blas_kernels(const CpuFeatures& cpu, const BlasKernels& blas,
                                       const char* user_coretype, const char* chosen_alone) {
  BlasKernelDecision d;
  if (!blas.openblas) {
    d.note = "not OpenBLAS: kernels of its own choosing";
    return d;
  }
  bool known = false;
  const VectorIsa runs = openblas_core_isa(blas.core, &known);
  if (cpu.vendor.empty() || !known) { // not x86-64, or a kernel set newer than cubelm
    d.note = blas.core + " kernels";
    return d;
  }
  const VectorIsa has = cpu.isa();
  const std::string fit = openblas_coretype_for(cpu);
  const std::string processor = std::string(isa_name(has)) + " processor";
  const bool below = runs < has;
  const bool by_cubelm = chosen_alone != nullptr && *chosen_alone != '\0';
  const bool by_user = !by_cubelm && user_coretype != nullptr;

  const std::string head = blas.core + " kernels (" + isa_name(runs);
  if (!below) {
    d.note = head + ", as the processor";
    if (by_cubelm)
      d.note += std::string("; ") + kCoretype + "=" + (user_coretype ? user_coretype : "") +
                " set by cubelm: " + blas.library + " alone chose " + chosen_alone;
    else if (by_user)
      d.note += std::string("; ") + kCoretype + "=" + user_coretype + " from the environment";
    d.note += ")";
    return d;
  }
  d.note = head + ", BELOW this " + processor;
  const std::string slower = "its gemms run slower than with the " + fit +
                             " kernels, up to 5x (docs/launching.md#blas-kernels)";
  if (by_user) {
    d.note += std::string("; ") + kCoretype + "=" + user_coretype + " from the environment, kept)";
    d.warning = blas.library + " runs " + kernels_of(blas.core, runs) + " on this " + processor +
                " because the environment sets " + kCoretype + "=" + user_coretype + ": " + slower +
                ". Unset it, or set " + kCoretype + "=" + fit + ", unless this machine needs it.";
    return d;
  }
  if (by_cubelm) { // restarted with OPENBLAS_CORETYPE, and the BLAS did not take it
    d.note += std::string("; ") + kCoretype + "=" + (user_coretype ? user_coretype : "") +
              " set by cubelm, not taken)";
    d.warning =
        blas.library + " did not take " + kCoretype + "=" + (user_coretype ? user_coretype : "") +
        " and still runs " + kernels_of(blas.core, runs) + " on this " + processor + ": " + slower +
        ". Link an OpenBLAS that knows this processor " + "(cmake -DCUBELM_BLAS_LIBRARY=...).";
    return d;
  }
  if (!blas.dynamic) {
    d.note += "; the BLAS is built for these alone)";
    d.warning = blas.library + " is built for " + blas.core + " alone (no DYNAMIC_ARCH) and runs " +
                kernels_of(blas.core, runs) + " on this " + processor + ": " + slower +
                ". Link an OpenBLAS built with DYNAMIC_ARCH=1 (Debian's libopenblas0-openmp) " +
                "or for this processor (cmake -DCUBELM_BLAS_LIBRARY=...).";
    return d;
  }
  d.note += ")";
  d.action = BlasKernelDecision::Action::restart;
  d.coretype = fit;
  return d;
}

BlasKernelDecision blas_kernel_decision() {
  return decide_blas_kernels(cpu_features(), blas_kernels(), std::getenv(kCoretype),
                             std::getenv(kChosenAlone));
}

BlasKernelDecision ensure_blas_kernels(char** argv) {
  BlasKernelDecision d = blas_kernel_decision();
  if (d.action != BlasKernelDecision::Action::restart)
    return d;
  const std::string alone = blas_kernels().core;
  setenv(kCoretype, d.coretype.c_str(), 1);
  setenv(kChosenAlone, alone.c_str(), 1);
  // The program's own file by its real path (not /proc/self/exe, which would name the
  // process "exe" in ps, top and pgrep).
  char self[4096] = {0};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  // With OMP_PROC_BIND set, the OpenMP runtime pinned this thread to its first place
  // as the program loaded, and execv keeps a thread's mask: without this, the program
  // would start on that one place, and every OpenMP thread would share it.
  restore_launch_affinity();
  execv(n > 0 ? self : "/proc/self/exe", argv);
  // Still here: the restart failed. Run on as loaded, and say what to set.
  const int err = errno;
  unsetenv(kCoretype);
  unsetenv(kChosenAlone);
  d.action = BlasKernelDecision::Action::keep;
  d.note = alone + " kernels (BELOW this " + isa_name(cpu_features().isa()) + " processor)";
  d.warning = "cubelm could not execute itself again with " + std::string(kCoretype) + "=" +
              d.coretype + " (" + std::strerror(err) + "); the BLAS runs " + alone +
              " kernels. Set " + kCoretype + "=" + d.coretype + " in the environment.";
  return d;
}

} // namespace cubelm::kernels
