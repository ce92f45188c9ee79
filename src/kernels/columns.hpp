#pragma once
// Column reductions (bias and LayerNorm parameter gradients) in two levels, so
// that there is work for every core and every GPU thread however few columns a
// matrix has: first each work item sums one row block (kRowBlock rows) of one
// column chunk (kColumnChunk columns), then the blocks' partial sums are added
// column by column, in block order. The order of every sum is fixed by the
// shape alone, so the bits are the same on any number of threads and on CPUs
// and GPUs alike. Internal to src/kernels.

#include "ranges.hpp"
#include "scratch.hpp"

#include <cstdint>

namespace cubelm::kernels::detail {

/// out0(j) += sum over rows n of term(n, j)[0], out1(j) += sum of term(n, j)[1] (K = 2;
/// K = 1: out0 only), where `term(n, j)` returns row n's terms of column j as a
/// Kokkos::Array<T, K>. `partial` holds the row blocks' sums when there is more than one.
template <int K, class T, class Term>
void column_sums(const ExecSpace& exec, const char* label, std::int64_t rows, std::int64_t cols,
                 const Term& term, const Vec<T>& out0, const Vec<T>& out1, Scratch<T>& partial) {
  static_assert(K == 1 || K == 2, "column_sums: one or two outputs");
  if (rows == 0 || cols == 0)
    return;
  const std::int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const std::int64_t chunks = (cols + kColumnChunk - 1) / kColumnChunk;
  const Vec<T> sums =
      blocks > 1 ? Vec<T>(partial.get(static_cast<std::size_t>(K * blocks * cols))) : Vec<T>();
  Kokkos::parallel_for(
      label, Range(exec, 0, blocks * chunks), KOKKOS_LAMBDA(const std::int64_t item) {
        const std::int64_t r = item / chunks, j0 = (item % chunks) * kColumnChunk;
        const std::int64_t width = cols - j0 < kColumnChunk ? cols - j0 : kColumnChunk;
        const std::int64_t n1 = (r + 1) * kRowBlock < rows ? (r + 1) * kRowBlock : rows;
        T acc[K][kColumnChunk] = {};
        auto add = [&](const std::int64_t n, const std::int64_t jj) {
          const Kokkos::Array<T, K> v = term(n, j0 + jj);
          for (int k = 0; k < K; ++k)
            acc[k][jj] += v[k];
        };
        if (width == kColumnChunk) // a constant trip count: unrolled and vectorised on CPUs
          for (std::int64_t n = r * kRowBlock; n < n1; ++n)
            for (std::int64_t jj = 0; jj < kColumnChunk; ++jj)
              add(n, jj);
        else
          for (std::int64_t n = r * kRowBlock; n < n1; ++n)
            for (std::int64_t jj = 0; jj < width; ++jj)
              add(n, jj);
        for (std::int64_t jj = 0; jj < width; ++jj)
          for (int k = 0; k < K; ++k) {
            if (blocks == 1)
              (k == 0 ? out0 : out1)(j0 + jj) += acc[k][jj];
            else
              sums((k * blocks + r) * cols + j0 + jj) = acc[k][jj];
          }
      });
  if (blocks == 1)
    return;
  Kokkos::parallel_for(
      label, Range(exec, 0, K * cols), KOKKOS_LAMBDA(const std::int64_t item) {
        const std::int64_t k = item / cols, j = item % cols;
        T total = 0;
        for (std::int64_t r = 0; r < blocks; ++r)
          total += sums((k * blocks + r) * cols + j);
        (k == 0 ? out0 : out1)(j) += total;
      });
}

} // namespace cubelm::kernels::detail
