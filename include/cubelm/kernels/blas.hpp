#pragma once
/// \file
/// \brief Dense linear algebra: the one place cubelm calls Kokkos Kernels' gemm.

#include "cubelm/core/cpu.hpp"
#include "cubelm/kernels/views.hpp"

#include <string>

namespace cubelm::kernels {

/// \brief C = alpha op(A) op(B) + beta C, op = transpose when the flag is set.
///
/// On float or double matrices (TA = TB = TC): the vendor BLAS (OpenBLAS, cuBLAS)
/// through Kokkos Kernels, on `exec` where Kokkos Kernels takes an execution space
/// instance (3.6 and later); Kokkos Kernels 3.4 and 3.5 run it on the default instance
/// (core/compat.hpp). Float products follow the gemm precision (kernels/precision.hpp).
///
/// With a bf16 matrix among them (a bf16 model: each of A, B and C bf16 or float): a
/// product of bfloat16 inputs (float inputs rounded to bfloat16) accumulated in float,
/// C stored as TC. cublasGemmEx in CUDA builds; on CPUs, whose BLAS has no bfloat16
/// product, sgemm on float copies of tiles of at most 1024 x 1024 of C and their panels
/// of A and B (the tiles' scratch: at most 2 x 1024 x k + 1024^2 floats).
template <class TA, class TB = TA, class TC = TA>
void gemm(const ExecSpace& exec, bool trans_a, bool trans_b, compute_t<TC> alpha, const Mat<TA>& a,
          const Mat<TB>& b, compute_t<TC> beta, const Mat<TC>& c);

/// \brief A stack of `count` row-major matrices [count, rows, cols], one after the other.
template <class T>
using Batch = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace>;

/// \brief C_i = alpha op(A_i) op(B_i) + beta C_i for every matrix i of the batch.
///
/// One strided-batched product: cublas{S,D}gemmStridedBatched on `exec`'s stream in
/// CUDA builds (cublasGemmStridedBatchedEx in bf16), and on CPUs the matrices spread
/// over the threads, one single-threaded BLAS product each (or one after the other on
/// all threads when there are fewer matrices than threads). Follows the gemm precision
/// (kernels/precision.hpp) like gemm.
template <class T>
void gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, T alpha, const Batch<T>& a,
                  const Batch<T>& b, T beta, const Batch<T>& c);

/// \brief How the BLAS linked in runs its threads: "OpenBLAS 0.3.21, OpenMP threads",
/// "... pthreads", "... sequential", or "not OpenBLAS" (asked at run time, so it names
/// the library really loaded).
std::string blas_threading();

/// \brief True when the BLAS uses threads of its own (OpenBLAS' pthreads build): with
/// more than one Kokkos thread they compete with Kokkos' for the cores.
bool blas_has_own_threads();

/// \brief The kernel set of the BLAS loaded into this process.
struct BlasKernels {
  bool openblas = false; ///< false: another BLAS, whose kernels cubelm cannot name
  std::string library;   ///< "OpenBLAS 0.3.21"
  std::string core;      ///< openblas_get_corename(): "SkylakeX", "Haswell", "Prescott", ...
  bool dynamic = false;  ///< built with DYNAMIC_ARCH: picks its kernels when it loads and
                         ///< then reads OPENBLAS_CORETYPE
};

/// \brief Asks the loaded BLAS (OpenBLAS' openblas_get_corename and openblas_get_config,
/// looked up at run time).
BlasKernels blas_kernels();

/// \brief The widest vector instructions an OpenBLAS x86-64 kernel set uses: AVX-512 for
/// SkylakeX, Cooperlake and SapphireRapids; AVX2 for Haswell, Zen and Excavator; AVX for
/// Sandybridge and AMD's Bulldozer line; none for Prescott, Core2, Nehalem and the other
/// older ones. `known` is false for a name cubelm does not know (a newer OpenBLAS).
VectorIsa openblas_core_isa(const std::string& core, bool* known = nullptr);

/// \brief The OPENBLAS_CORETYPE whose kernels fit a processor: SkylakeX (AVX-512),
/// Haswell (Intel AVX2), Zen (AMD AVX2), Sandybridge (AVX); empty below AVX.
std::string openblas_coretype_for(const CpuFeatures& cpu);

/// \brief What cubelm does about the BLAS' kernels before MPI and Kokkos start.
struct BlasKernelDecision {
  /// keep: run as loaded; restart: set OPENBLAS_CORETYPE = `coretype` and execute
  /// this program again, once (OpenBLAS reads the variable only when it loads).
  enum class Action { keep, restart };
  Action action = Action::keep;
  std::string coretype; ///< for restart: the value to set
  std::string note;     ///< the kernel set and why, for --version and the start line
  std::string warning;  ///< not empty: the BLAS runs below the processor, and what to do
};

/// \brief The decision, from given facts (unit tests pass their own):
/// `user_coretype` is OPENBLAS_CORETYPE as the user's environment has it (nullptr:
/// unset), always kept; `chosen_alone` is the kernel set the BLAS chose by itself
/// before cubelm restarted it (nullptr: not restarted; set by the restart).
BlasKernelDecision decide_blas_kernels(const CpuFeatures& cpu, const BlasKernels& blas,
                                       const char* user_coretype, const char* chosen_alone);

/// \brief The decision for this process: its processor, its BLAS, its environment.
BlasKernelDecision blas_kernel_decision();

/// \brief First thing in main, before MPI or Kokkos start: where the BLAS runs kernels
/// below the processor and may be told otherwise, sets OPENBLAS_CORETYPE and executes
/// the program again with the same arguments (its own file, found through /proc/self/exe), once.
/// Returns the decision it kept (its warning when the restart could not happen).
BlasKernelDecision ensure_blas_kernels(char** argv);

/// \brief The widest vector instructions cubelm's own kernels were compiled for
/// (CMake's CUBELM_CPU_ARCH, docs/kernels.md#instruction-sets).
VectorIsa kernels_built_isa();

/// \brief Empty where `cpu` runs the kernels as built; otherwise the error to print
/// before anything else runs (a processor without the build's instructions stops at
/// the first one, SIGILL, with no message).
std::string kernels_isa_mismatch(const CpuFeatures& cpu);

/// \brief The single-precision gemm rate of this device in GFLOP/s (512^3 products,
/// repeated for at least 0.2 s): the peak `cubelm train` reports MFU against.
double measure_gemm_gflops();

} // namespace cubelm::kernels
