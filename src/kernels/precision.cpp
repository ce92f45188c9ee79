#include "cubelm/kernels/precision.hpp"

#include "cubelm/core/error.hpp"

#include "bf16_gemm.hpp"
#include "ranges.hpp"

#include <KokkosBlas3_gemm.hpp>

#ifdef KOKKOS_ENABLE_CUDA
#include <KokkosBlas_tpl_spec.hpp>
#include <cublas_v2.h>
#endif

#include <string>

namespace cubelm::kernels {

namespace {

Precision g_precision = Precision::fp32;

// Scratch for the rounded inputs, kept between calls (grown, never shrunk) and
// released before Kokkos finalizes.
template <class E>
struct Scratch {
  Kokkos::View<E*, MemSpace> buffer[2];
  bool hooked = false;
  Kokkos::View<E*, MemSpace> get(int which, std::size_t n) {
    if (!hooked) {
      Kokkos::push_finalize_hook([this] {
        buffer[0] = {};
        buffer[1] = {};
        hooked = false;
      });
      hooked = true;
    }
    if (buffer[which].extent(0) < n)
      buffer[which] = Kokkos::View<E*, MemSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::bf16_scratch")), n);
    return buffer[which];
  }
};

#ifdef KOKKOS_ENABLE_CUDA
cublasHandle_t cublas_handle() {
  return KokkosBlas::Impl::CudaBlasSingleton::singleton().handle;
}

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw InternalError(std::string("cuBLAS ") + call + " failed with status " +
                        std::to_string(static_cast<int>(status)));
}
#endif

} // namespace

void set_gemm_precision(Precision precision) {
  g_precision = precision;
#ifdef KOKKOS_ENABLE_CUDA
  // TF32 tensor-op math for Kokkos Kernels' sgemm (cuBLAS' handle); plain fp32 otherwise.
  check(cublasSetMathMode(cublas_handle(), precision == Precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                        : CUBLAS_DEFAULT_MATH),
        "cublasSetMathMode");
#endif
}

Precision gemm_precision() {
  return g_precision;
}

void round_to_bf16(const ExecSpace& exec, const Mat<float>& src, const Mat<float>& dst) {
  Kokkos::parallel_for(
      "cubelm::round_to_bf16", over(exec, src.extent(0), src.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
        dst(i, j) = bf16_round(src(i, j));
      });
}

namespace detail {

#ifdef KOKKOS_ENABLE_CUDA

void bf16_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha, const Mat<float>& a,
               const Mat<float>& b, float beta, const Mat<float>& c) {
  static Scratch<std::uint16_t> scratch;
  // Contiguous bf16 copies (row-major, leading dimension = columns).
  auto copy = [&](const Mat<float>& m, int which) {
    const auto buf = scratch.get(which, m.extent(0) * m.extent(1));
    const std::int64_t cols = m.extent(1);
    Kokkos::parallel_for(
        "cubelm::to_bf16", over(exec, m.extent(0), m.extent(1)),
        KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
          buf(i * cols + j) = bf16_bits(m(i, j));
        });
    return buf;
  };
  const auto a16 = copy(a, 0);
  const auto b16 = copy(b, 1);
  const int m = static_cast<int>(c.extent(0)), n = static_cast<int>(c.extent(1));
  const int k = static_cast<int>(trans_a ? a.extent(0) : a.extent(1));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublasHandle_t handle = cublas_handle();
  check(cublasSetStream(handle, exec.cuda_stream()), "cublasSetStream");
  check(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b16.data(), CUDA_R_16BF,
                     static_cast<int>(b.extent(1)), a16.data(), CUDA_R_16BF,
                     static_cast<int>(a.extent(1)), &beta, c.data(), CUDA_R_32F,
                     static_cast<int>(c.stride(0)), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

#else

void bf16_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha, const Mat<float>& a,
               const Mat<float>& b, float beta, const Mat<float>& c) {
  static Scratch<float> scratch;
  // bf16 inputs, fp32 products and sums: sgemm on copies rounded to bfloat16.
  auto rounded = [&](const Mat<float>& m, int which) {
    const auto buf = scratch.get(which, m.extent(0) * m.extent(1));
    const Mat<float> out(buf.data(), m.extent(0), m.extent(1));
    round_to_bf16(exec, m, out);
    return out;
  };
  const Mat<float> ra = rounded(a, 0), rb = rounded(b, 1);
  KokkosBlas::gemm(trans_a ? "T" : "N", trans_b ? "T" : "N", alpha, ra, rb, beta, c);
}

#endif

} // namespace detail
} // namespace cubelm::kernels
