#pragma once
// Iteration ranges of the layer kernels (embedding, layernorm, elementwise,
// loss) and the column chunk of their column reductions. Internal to src/kernels.

#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::kernels {

using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
using Range2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;

inline Range2 over(const ExecSpace& exec, std::int64_t rows, std::int64_t cols) {
  return Range2(exec, {0, 0}, {rows, cols});
}

// Columns summed together by one work item of a column reduction: enough for
// whole cache lines per row, few enough to keep the partial sums in registers.
constexpr std::int64_t kColumnChunk = 32;

} // namespace cubelm::kernels
