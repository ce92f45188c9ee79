#pragma once
// Iteration ranges of the kernels: flat ranges for elementwise work,
// teams for work along a row (one team per row of a matrix, or per chunk of a
// flat buffer), and the column chunk of the column reductions on CPUs.
// Internal to src/kernels.

#include "cubelm/kernels/views.hpp"

#include <cstdint>
#include <type_traits>

namespace cubelm::kernels {

using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
using Team = Kokkos::TeamPolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
using Member = Team::member_type;

namespace detail {

/// for_each_element's mapping on GPUs: one work item per element of the flat index
/// i = n * cols + j, so that consecutive work items take consecutive columns of a row.
/// The row and column come from one division, in 32 bits where the matrix has fewer
/// than 2^32 elements (every matrix of a model in practice): a 64-bit division costs
/// several times the instructions. It runs on any execution space.
template <class F>
void for_each_flat(const char* label, const ExecSpace& exec, std::int64_t rows, std::int64_t cols,
                   const F& f) {
  if (rows <= 0 || cols <= 0)
    return;
  const std::int64_t size = rows * cols;
  const bool narrow = size <= static_cast<std::int64_t>(UINT32_MAX);
  Kokkos::parallel_for(
      label, Range(exec, 0, size), KOKKOS_LAMBDA(const std::int64_t i) {
        // `narrow` is the same for every work item: a GPU's threads do not diverge on it.
        if (narrow) {
          const auto u = static_cast<std::uint32_t>(i), c = static_cast<std::uint32_t>(cols);
          const std::uint32_t n = u / c;
          f(static_cast<std::int64_t>(n), static_cast<std::int64_t>(u - n * c));
        } else {
          const std::int64_t n = i / cols;
          f(n, i - n * cols);
        }
      });
}

} // namespace detail

/// f(n, j) for every element of a rows x cols (LayoutRight) matrix.
///
/// On GPUs one thread per element (detail::for_each_flat): the threads of a warp take
/// consecutive columns of a row, so loads and stores coalesce, and any shape launches.
/// (A default-tiled MDRangePolicy<Rank<2>> does neither on Kokkos 3.4's CUDA backend:
/// its blocks are 16 rows x 2 columns with the thread index on the rows, and the
/// columns go to the grid's second dimension, capped at 65535 blocks.)
///
/// On CPUs one work item per row with a plain loop over its columns, which the
/// compiler vectorises (a flat index would divide per element, and the tiled loops
/// of a host MDRangePolicy are not vectorised either).
template <class F>
void for_each_element(const char* label, const ExecSpace& exec, std::int64_t rows,
                      std::int64_t cols, const F& f) {
  if constexpr (kOnHost) {
    if (rows <= 0 || cols <= 0)
      return;
    Kokkos::parallel_for(
        label, Range(exec, 0, rows), KOKKOS_LAMBDA(const std::int64_t n) {
          const F g(f);
          for (std::int64_t j = 0; j < cols; ++j)
            g(n, j);
        });
  } else {
    detail::for_each_flat(label, exec, rows, cols, f);
  }
}

/// copy(row, i, t, j, col) for every element of a head-major block [B * heads, len, d] and
/// the positions [t_begin, t_begin + len) of the B sequences of a token-major matrix
/// [B * seq, heads * d] (attention's layouts): row = b * seq + t_begin + t,
/// i = b * heads + h, col = h * d + j. On CPUs one work item per token row, whose heads
/// are contiguous runs of d columns: no division per head, and a row of the matrix read
/// or written whole (for_each_element over the block's rows of d elements spent more time
/// on each row's divisions than on its copy where d is 32). On GPUs one thread per
/// element, consecutive threads on consecutive columns of the matrix's row.
template <class F>
void over_heads(const char* label, const ExecSpace& exec, std::int64_t batch, std::int64_t seq,
                std::int64_t t_begin, std::int64_t len, int heads, std::int64_t d, const F& copy) {
  if constexpr (kOnHost) {
    Kokkos::parallel_for(
        label, Range(exec, 0, batch * len), KOKKOS_LAMBDA(const std::int64_t p) {
          const std::int64_t b = p / len, t = p % len, row = b * seq + t_begin + t;
          for (std::int64_t h = 0; h < heads; ++h)
            for (std::int64_t j = 0; j < d; ++j)
              copy(row, b * heads + h, t, j, h * d + j);
        });
  } else {
    for_each_element(
        label, exec, batch * len * heads, d,
        KOKKOS_LAMBDA(const std::int64_t r, const std::int64_t j) {
          const std::int64_t p = r / heads, h = r % heads, b = p / len, t = p % len;
          copy(b * seq + t_begin + t, b * heads + h, t, j, h * d + j);
        });
  }
}

/// Columns per chunk of for_each_chunk: a few float arrays of this length stay in L1.
constexpr std::int64_t kChunk = 256;

/// CPUs only: f(n, j0, width) for every row n and every chunk [j0, j0 + width) of its
/// columns, width <= kChunk, one work item per row. For kernels on bf16 storage that
/// convert a chunk to float arrays, compute on them, and round the results back, in three
/// loops: one loop that converts and computes at once is vectorised at the width of the
/// 2-byte values (16 lanes in 256-bit registers), twice the registers a float loop takes,
/// and a long computation (GELU's tanh) then spills to memory.
template <class F>
void for_each_chunk(const char* label, const ExecSpace& exec, std::int64_t rows, std::int64_t cols,
                    const F& f) {
  static_assert(kOnHost || sizeof(F) == 0, "for_each_chunk is for CPUs");
  if (rows <= 0 || cols <= 0)
    return;
  Kokkos::parallel_for(
      label, Range(exec, 0, rows), KOKKOS_LAMBDA(const std::int64_t n) {
        const F g(f);
        for (std::int64_t j0 = 0; j0 < cols; j0 += kChunk)
          g(n, j0, cols - j0 < kChunk ? cols - j0 : kChunk);
      });
}

// Rows at least this wide get a larger team on a GPU (the vocabulary rows of the loss).
constexpr std::int64_t kWideRow = 4096;

/// One team per row of `rows` rows of `cols` elements (or per chunk of a flat buffer).
/// On a GPU the team is a warp (128 threads for wide rows) whose threads read
/// consecutive elements together, so loads coalesce, and a row's reductions are
/// tree reductions inside the team, as in llm.c's warp per row. On CPUs a team is
/// one thread that walks its row in order: the loop a compiler vectorises where
/// it can, with sums in the order of the row, so the bits do not depend on the
/// number of threads.
inline Team per_row(const ExecSpace& exec, std::int64_t rows, std::int64_t cols) {
  const int league = static_cast<int>(rows);
  if constexpr (kOnHost) {
    (void)cols;
    return Team(exec, league, 1);
  } else {
    return Team(exec, league, cols >= kWideRow ? 128 : 32);
  }
}

// Loops over a row inside a per_row team. On GPUs they are Kokkos' team ranges
// (a thread takes every team_size-th element; sums and maxima are tree
// reductions in the team). On CPUs the team is one thread, and they are plain
// loops with unit stride, which the compiler can unroll and vectorise: Kokkos'
// host team ranges step by the team size, a run-time value, which blocks both.

/// f(i) for i in [begin, end).
template <class F>
KOKKOS_INLINE_FUNCTION void team_for(const Member& team, std::int64_t begin, std::int64_t end,
                                     const F& f) {
  if constexpr (kOnHost) {
    (void)team;
    for (std::int64_t i = begin; i < end; ++i)
      f(i);
  } else {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), f);
  }
}

// Partial sums a CPU thread keeps for a row: independent chains of additions, which
// hide the latency of each addition and let the compiler use vector registers.
constexpr int kLanes = 8;

// Asks for the kLanes partial sums (or maxima) of a row to be one vector register: each
// lane still takes the same elements in the same order, so the bits do not change. GCC
// left the maxima as eight scalar chains without it; simdlen keeps them in one register
// where the kernels are built for 512-bit vectors (GCC shuffled 8 lanes in 16).
#if defined(_OPENMP)
#define CUBELM_LANES _Pragma("omp simd simdlen(8)")
#else
#define CUBELM_LANES
#endif

/// The sum of term(i) over i in [begin, end), on every thread of the team; term may
/// also write (the softmax stores each exponential it adds). The order is fixed by the
/// range alone: on CPUs element i goes to partial sum (i - begin) mod kLanes, in
/// increasing i, and the partial sums are added pairwise; on GPUs each thread sums its
/// elements and the team adds the threads' sums as a tree.
template <class T, class F>
KOKKOS_INLINE_FUNCTION T team_sum(const Member& team, std::int64_t begin, std::int64_t end,
                                  const F& term) {
  T total = 0;
  if constexpr (kOnHost) {
    (void)team;
    T lane[kLanes] = {};
    std::int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      CUBELM_LANES
      for (int l = 0; l < kLanes; ++l)
        lane[l] += term(i + l);
    }
    for (int l = 0; i < end; ++i, ++l)
      lane[l] += term(i);
    for (int width = kLanes / 2; width > 0; width /= 2)
      for (int l = 0; l < width; ++l)
        lane[l] += lane[l + width];
    total = lane[0];
  } else {
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, begin, end),
        [&](const std::int64_t i, T& a) { a += term(i); }, total);
  }
  return total;
}

/// The largest x(i) for i in [begin, end), on every thread of the team (the lowest
/// finite value for an empty range; NaNs are passed over). On CPUs as kLanes running
/// maxima, like team_sum.
template <class T, class X>
KOKKOS_INLINE_FUNCTION T team_max(const Member& team, std::int64_t begin, std::int64_t end,
                                  const X& x) {
  T m = Kokkos::reduction_identity<T>::max();
  if constexpr (kOnHost) {
    (void)team;
    T lane[kLanes];
    for (int l = 0; l < kLanes; ++l)
      lane[l] = m;
    std::int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      CUBELM_LANES
      for (int l = 0; l < kLanes; ++l)
        lane[l] = x(i + l) > lane[l] ? x(i + l) : lane[l];
    }
    for (int l = 0; i < end; ++i, ++l)
      lane[l] = x(i) > lane[l] ? x(i) : lane[l];
    for (int l = 0; l < kLanes; ++l)
      m = lane[l] > m ? lane[l] : m;
  } else {
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, begin, end),
        [&](const std::int64_t i, T& a) { a = x(i) > a ? x(i) : a; }, Kokkos::Max<T>(m));
  }
  return m;
}

/// Waits until every thread of the team has done the work before it (a no-op on CPUs).
KOKKOS_INLINE_FUNCTION void team_sync(const Member& team) {
  if constexpr (kOnHost)
    (void)team;
  else
    team.team_barrier();
}

/// f() once per team.
template <class F>
KOKKOS_INLINE_FUNCTION void team_once(const Member& team, const F& f) {
  if constexpr (kOnHost) {
    (void)team;
    f();
  } else {
    Kokkos::single(Kokkos::PerTeam(team), f);
  }
}

// Columns summed together by one work item of a column reduction on CPUs: enough
// for whole cache lines per row, few enough to keep the partial sums in registers.
// On GPUs a work item takes one column, so that a warp reads consecutive columns.
constexpr std::int64_t kColumnChunk = kOnHost ? 32 : 1;
// Rows summed by one work item of a column reduction, before the partial sums of
// the row blocks are added in order.
constexpr std::int64_t kRowBlock = 64;

} // namespace cubelm::kernels
