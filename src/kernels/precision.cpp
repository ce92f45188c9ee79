#include "cubelm/kernels/precision.hpp"

#include "cubelm/core/error.hpp"

#include "gemm_detail.hpp"
#include "ranges.hpp"
#include "scratch.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include "cublas.hpp"
#endif

#include <string>

namespace cubelm::kernels {

namespace {

Precision g_precision = Precision::fp32;

} // namespace

void set_gemm_precision(Precision precision) {
  g_precision = precision;
#ifdef KOKKOS_ENABLE_CUDA
  // TF32 tensor-op math for Kokkos Kernels' sgemm (cuBLAS' handle); plain fp32 otherwise.
  detail::cublas_check(cublasSetMathMode(detail::cublas_handle(), precision == Precision::tf32
                                                                      ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                      : CUBLAS_DEFAULT_MATH),
                       "cublasSetMathMode");
#endif
}

Precision gemm_precision() {
  return g_precision;
}

void round_to_bf16(const ExecSpace& exec, const Mat<float>& src, const Mat<float>& dst) {
  for_each_element(
      "cubelm::round_to_bf16", exec, src.extent(0), src.extent(1),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
        dst(i, j) = bf16_round(src(i, j));
      });
}

namespace detail {

namespace {

// The matrices of a batch as one [count * rows, cols] matrix (they are contiguous).
Mat<float> flat(const Batch<float>& m) {
  return Mat<float>(m.data(), m.extent(0) * m.extent(1), m.extent(2));
}
} // namespace

#ifdef KOKKOS_ENABLE_CUDA

namespace {

// A matrix as a batch of one, and the shape of its product.
Batch<float> as_batch(const Mat<float>& m) {
  CUBELM_ASSERT(m.span_is_contiguous(), "bf16 gemm: a matrix with padded rows");
  return Batch<float>(m.data(), 1, m.extent(0), m.extent(1));
}
BatchShape single(bool trans_a, bool trans_b, const Mat<float>& a, const Mat<float>& b,
                  const Mat<float>& c) {
  const std::size_t ea[3] = {1, a.extent(0), a.extent(1)};
  const std::size_t eb[3] = {1, b.extent(0), b.extent(1)};
  const std::size_t ec[3] = {1, c.extent(0), c.extent(1)};
  return batch_shape(trans_a, trans_b, ea, eb, ec);
}

} // namespace

void bf16_gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha,
                       const Batch<float>& a, const Batch<float>& b, float beta,
                       const Batch<float>& c, const BatchShape& s) {
  static Scratch<std::uint16_t> scratch_a("cubelm::bf16_scratch"),
      scratch_b("cubelm::bf16_scratch");
  // Contiguous bf16 copies (row-major, leading dimension = columns).
  auto copy = [&](const Mat<float>& m, Scratch<std::uint16_t>& scratch) {
    const auto buf = scratch.get(m.extent(0) * m.extent(1));
    const std::int64_t cols = m.extent(1);
    for_each_element(
        "cubelm::to_bf16", exec, m.extent(0), m.extent(1),
        KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
          buf(i * cols + j) = bf16_bits(m(i, j));
        });
    return buf;
  };
  const auto a16 = copy(flat(a), scratch_a);
  const auto b16 = copy(flat(b), scratch_b);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublas_check(cublasGemmStridedBatchedEx(cublas_on(exec), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.n, s.m, s.k,
                                          &alpha, b16.data(), CUDA_R_16BF, s.ldb, s.stride_b,
                                          a16.data(), CUDA_R_16BF, s.lda, s.stride_a, &beta,
                                          c.data(), CUDA_R_32F, s.ldc, s.stride_c, s.count,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

void bf16_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha, const Mat<float>& a,
               const Mat<float>& b, float beta, const Mat<float>& c) {
  bf16_gemm_batched(exec, trans_a, trans_b, alpha, as_batch(a), as_batch(b), beta, as_batch(c),
                    single(trans_a, trans_b, a, b, c));
}

#else

namespace {

// bf16 inputs, fp32 products and sums: the fp32 products on copies rounded to bfloat16.
Mat<float> rounded(const ExecSpace& exec, const Mat<float>& m, Scratch<float>& scratch) {
  const auto buf = scratch.get(m.extent(0) * m.extent(1));
  const Mat<float> out(buf.data(), m.extent(0), m.extent(1));
  round_to_bf16(exec, m, out);
  return out;
}
Scratch<float> g_scratch_a("cubelm::bf16_scratch"), g_scratch_b("cubelm::bf16_scratch");

} // namespace

void bf16_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha, const Mat<float>& a,
               const Mat<float>& b, float beta, const Mat<float>& c) {
  vendor_gemm(exec, trans_a, trans_b, alpha, rounded(exec, a, g_scratch_a),
              rounded(exec, b, g_scratch_b), beta, c);
}

void bf16_gemm_batched(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha,
                       const Batch<float>& a, const Batch<float>& b, float beta,
                       const Batch<float>& c, const BatchShape& s) {
  const Mat<float> ra = rounded(exec, flat(a), g_scratch_a);
  const Mat<float> rb = rounded(exec, flat(b), g_scratch_b);
  host_gemm_batched(exec, trans_a, trans_b, alpha, ra.data(), rb.data(), beta, c.data(), s);
}

#endif

} // namespace detail
} // namespace cubelm::kernels
