#include "cubelm/kernels/precision.hpp"

#include "cubelm/core/error.hpp"

#include "gemm_detail.hpp"
#include "ranges.hpp"
#include "scratch.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include "cublas.hpp"
#endif

#include <string>
#include <type_traits>

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

template <class S, class D>
void convert(const ExecSpace& exec, const Vec<S>& src, const Vec<D>& dst) {
  CUBELM_ASSERT(src.extent(0) == dst.extent(0), "convert: views of different lengths");
  Kokkos::parallel_for(
      "cubelm::convert", Range(exec, 0, static_cast<std::int64_t>(src.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) { dst(i) = src(i); });
}

template void convert<float, bf16>(const ExecSpace&, const Vec<float>&, const Vec<bf16>&);
template void convert<bf16, float>(const ExecSpace&, const Vec<bf16>&, const Vec<float>&);

namespace detail {

namespace {

// The matrices of a batch as one [count * rows, cols] matrix (they are contiguous).
Mat<float> flat(const Batch<float>& m) {
  return Mat<float>(m.data(), m.extent(0) * m.extent(1), m.extent(2));
}

// A row-major matrix view's leading dimension (its row stride; its columns for one row).
template <class T>
std::int64_t leading(const Mat<T>& m) {
  return m.extent(0) <= 1 ? static_cast<std::int64_t>(m.extent(1))
                          : static_cast<std::int64_t>(m.stride(0));
}
} // namespace

#ifdef KOKKOS_ENABLE_CUDA

namespace {

// A contiguous bf16 copy of `m` in `scratch` (row-major, leading dimension = columns),
// the operand cuBLAS reads for a float matrix.
Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, MemSpace>
bf16_copy(const ExecSpace& exec, const Mat<float>& m, Scratch<std::uint16_t>& scratch) {
  const auto buf = scratch.get(m.extent(0) * m.extent(1));
  const std::int64_t cols = m.extent(1);
  for_each_element(
      "cubelm::to_bf16", exec, m.extent(0), m.extent(1),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
        buf(i * cols + j) = bf16_bits(m(i, j));
      });
  return buf;
}

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
  const auto a16 = bf16_copy(exec, flat(a), scratch_a);
  const auto b16 = bf16_copy(exec, flat(b), scratch_b);
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

namespace {

// The bfloat16 elements of `m` for cuBLAS: a bf16 matrix itself, a float one rounded
// into `scratch`; `ld` gets its leading dimension.
template <class T>
const void* bf16_operand(const ExecSpace& exec, const Mat<T>& m, Scratch<std::uint16_t>& scratch,
                         int& ld) {
  if constexpr (std::is_same_v<T, bf16>) {
    CUBELM_ASSERT(m.extent(0) <= 1 || m.stride(0) >= m.extent(1), "bf16 gemm: a matrix view");
    ld = static_cast<int>(leading(m));
    return m.data();
  } else {
    ld = static_cast<int>(m.extent(1));
    return bf16_copy(exec, m, scratch).data();
  }
}

} // namespace

template <class TA, class TB, class TC>
void bf16_storage_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha,
                       const Mat<TA>& a, const Mat<TB>& b, float beta, const Mat<TC>& c) {
  static Scratch<std::uint16_t> scratch_a("cubelm::bf16_scratch"),
      scratch_b("cubelm::bf16_scratch");
  int lda = 0, ldb = 0;
  const void* a16 = bf16_operand(exec, a, scratch_a, lda);
  const void* b16 = bf16_operand(exec, b, scratch_b, ldb);
  const int m = static_cast<int>(c.extent(0)), n = static_cast<int>(c.extent(1));
  const int k = static_cast<int>(trans_a ? a.extent(0) : a.extent(1));
  const int ldc = static_cast<int>(leading(c));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  cublas_check(cublasGemmEx(cublas_on(exec), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                            trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b16, CUDA_R_16BF,
                            ldb, a16, CUDA_R_16BF, lda, &beta, c.data(),
                            std::is_same_v<TC, bf16> ? CUDA_R_16BF : CUDA_R_32F, ldc,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

#else

namespace {

// The float a bf16 product reads for an element: a bfloat16 exactly, a float rounded.
template <class T>
KOKKOS_INLINE_FUNCTION float bf16_input(T x) {
  if constexpr (std::is_same_v<T, bf16>)
    return x.value();
  else
    return bf16_round(x);
}

// Elements per work item of copy_block on contiguous blocks.
constexpr std::int64_t kFlat = 8192;

// dst(i, j) = f(src(i, j)) for a rows x cols block of row-major matrices with leading
// dimensions lds and ldd. Through raw pointers, in one flat loop when both blocks are
// contiguous (a whole matrix, as most products' operands are), or a loop per row: the
// loops vectorise, and a quick-start product's operands of 64 columns pay no per-row
// setup (for_each_element spent about 0.5 ns an element on these conversions).
template <class S, class D, class F>
void copy_block(const ExecSpace& exec, std::int64_t rows, std::int64_t cols, const S* src,
                std::int64_t lds, D* dst, std::int64_t ldd, const F& f) {
  if (rows <= 0 || cols <= 0)
    return;
  if (lds == cols && ldd == cols) {
    const std::int64_t n = rows * cols;
    Kokkos::parallel_for("cubelm::bf16_tile", Range(exec, 0, (n + kFlat - 1) / kFlat),
                         [=](const std::int64_t c) {
                           const S* __restrict s = src;
                           D* __restrict d = dst;
                           const std::int64_t end = (c + 1) * kFlat < n ? (c + 1) * kFlat : n;
                           for (std::int64_t e = c * kFlat; e < end; ++e)
                             d[e] = f(s[e]);
                         });
  } else {
    Kokkos::parallel_for("cubelm::bf16_tile", Range(exec, 0, rows), [=](const std::int64_t i) {
      const S* __restrict s = src + i * lds;
      D* __restrict d = dst + i * ldd;
      for (std::int64_t j = 0; j < cols; ++j)
        d[j] = f(s[j]);
    });
  }
}

// dst (rows x cols, row-major) = the block of src at (r0, c0) as bf16 inputs.
template <class T>
void input_block(const ExecSpace& exec, const Mat<T>& src, std::int64_t r0, std::int64_t rows,
                 std::int64_t c0, std::int64_t cols, float* dst) {
  const std::int64_t ld = leading(src);
  copy_block(exec, rows, cols, src.data() + r0 * ld + c0, ld, dst, cols,
             [](const T x) { return bf16_input(x); });
}

constexpr std::int64_t kTile = 1024; // rows and columns of C per sgemm (blas.hpp)

// bf16 inputs, fp32 products and sums: the fp32 products on copies rounded to bfloat16
// (the whole matrix as one input block: one flat loop where it is contiguous, as the
// batched products' operands are).
Mat<float> rounded(const ExecSpace& exec, const Mat<float>& m, Scratch<float>& scratch) {
  const std::int64_t rows = m.extent(0), cols = m.extent(1);
  const auto buf = scratch.get(static_cast<std::size_t>(rows * cols));
  input_block(exec, m, 0, rows, 0, cols, buf.data());
  return Mat<float>(buf.data(), rows, cols);
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

template <class TA, class TB, class TC>
void bf16_storage_gemm(const ExecSpace& exec, bool trans_a, bool trans_b, float alpha,
                       const Mat<TA>& a, const Mat<TB>& b, float beta, const Mat<TC>& c) {
  static Scratch<float> scratch_a("cubelm::bf16_tile"), scratch_b("cubelm::bf16_tile"),
      scratch_c("cubelm::bf16_tile");
  const std::int64_t m = c.extent(0), n = c.extent(1);
  const std::int64_t k = trans_a ? a.extent(0) : a.extent(1);
  const std::int64_t ldc = leading(c);
  const std::int64_t tm = m < kTile ? m : kTile, tn = n < kTile ? n : kTile;
  float* const pa = scratch_a.get(static_cast<std::size_t>(tm * k)).data();
  float* const pb = scratch_b.get(static_cast<std::size_t>(k * tn)).data();
  float* const pc =
      std::is_same_v<TC, float> ? nullptr : scratch_c.get(static_cast<std::size_t>(tm * tn)).data();
  for (std::int64_t i0 = 0; i0 < m; i0 += kTile) {
    const std::int64_t rows = m - i0 < kTile ? m - i0 : kTile;
    // op(A)'s rows i0.. as stored: A's rows, or with trans_a its columns.
    if (trans_a)
      input_block(exec, a, 0, k, i0, rows, pa);
    else
      input_block(exec, a, i0, rows, 0, k, pa);
    for (std::int64_t j0 = 0; j0 < n; j0 += kTile) {
      const std::int64_t cols = n - j0 < kTile ? n - j0 : kTile;
      if (trans_b)
        input_block(exec, b, j0, cols, 0, k, pb);
      else
        input_block(exec, b, 0, k, j0, cols, pb);
      const int lda = static_cast<int>(trans_a ? rows : k),
                ldb = static_cast<int>(trans_b ? k : cols);
      if constexpr (std::is_same_v<TC, float>) {
        exec.fence();
        host_gemm<float>(trans_a, trans_b, static_cast<int>(rows), static_cast<int>(cols),
                         static_cast<int>(k), alpha, pa, lda, pb, ldb, beta,
                         c.data() + i0 * ldc + j0, static_cast<int>(ldc));
      } else {
        TC* const tile = c.data() + i0 * ldc + j0;
        if (beta != 0.0f)
          copy_block(exec, rows, cols, tile, ldc, pc, cols, [](const TC x) { return float(x); });
        exec.fence();
        host_gemm<float>(trans_a, trans_b, static_cast<int>(rows), static_cast<int>(cols),
                         static_cast<int>(k), alpha, pa, lda, pb, ldb, beta, pc,
                         static_cast<int>(cols));
        copy_block(exec, rows, cols, pc, cols, tile, ldc, [](const float x) { return TC(x); });
      }
    }
  }
}

#endif

#define CUBELM_INSTANTIATE_BF16_GEMM(TA, TB, TC)                                                   \
  template void bf16_storage_gemm<TA, TB, TC>(const ExecSpace&, bool, bool, float, const Mat<TA>&, \
                                              const Mat<TB>&, float, const Mat<TC>&);
CUBELM_FOR_EACH_BF16_GEMM(CUBELM_INSTANTIATE_BF16_GEMM)

} // namespace detail
} // namespace cubelm::kernels
