#include "cubelm/kernels/loss.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/kernels/vmath.hpp"
#include "ranges.hpp"

#include <string>

namespace cubelm::kernels {

template <class T>
void row_max(const ExecSpace& exec, const Mat<T>& logits, std::int64_t valid,
             const Vec<compute_t<T>>& mx) {
  using C = compute_t<T>;
  const std::int64_t cols = logits.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_max", per_row(exec, logits.extent(0), cols), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const C m =
            team_max<C>(team, 0, valid, [&](const std::int64_t v) { return C(logits(n, v)); });
        team_once(team, [&]() { mx(n) = m; });
      });
}

template <class T>
void row_sumexp_target(const ExecSpace& exec, const Mat<T>& logits, const Vec<compute_t<T>>& mx,
                       const Tokens& targets, int first, std::int64_t valid,
                       const Mat<compute_t<T>>& stats) {
  using C = compute_t<T>;
  const std::int64_t cols = logits.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_sumexp_target", per_row(exec, logits.extent(0), cols),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const C m = mx(n);
        const std::int64_t t = targets(n) - first; // outside [0, cols): not in this slice
        const C target = (t >= 0 && t < valid) ? C(logits(n, t)) - m : C(0);
        team_sync(team); // every thread has read the target logit before it is replaced
        const C sum = team_sum<C>(team, 0, valid, [&](const std::int64_t v) {
          const C e = exp_of<C>(C(logits(n, v)) - m);
          logits(n, v) = e;
          return e;
        });
        team_once(team, [&]() {
          stats(n, 0) = sum;
          stats(n, 1) = target;
        });
      });
}

template <class T>
void vocab_cross_entropy(const ExecSpace& exec, const Mat<T>& logits,
                         const Mat<compute_t<T>>& stats, const Tokens& targets, int first,
                         std::int64_t valid, const Vec<compute_t<T>>& losses,
                         compute_t<T> grad_scale) {
  using C = compute_t<T>;
  const std::int64_t cols = logits.extent(1);
  Kokkos::parallel_for(
      "cubelm::vocab_cross_entropy", per_row(exec, logits.extent(0), cols),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        team_once(team, [&]() { losses(n) = kmath::log(stats(n, 0)) - stats(n, 1); });
        if (grad_scale == C(0))
          return;
        const C factor = grad_scale / stats(n, 0); // the exponentials are in place already
        team_for(team, 0, valid,
                 [&](const std::int64_t v) { logits(n, v) = C(logits(n, v)) * factor; });
        team_for(team, valid, cols, [&](const std::int64_t v) { logits(n, v) = C(0); });
        team_sync(team);
        const std::int64_t t = targets(n) - first; // outside [0, valid): not in this slice
        if (t >= 0 && t < valid)
          team_once(team, [&]() { logits(n, t) = C(logits(n, t)) - grad_scale; });
      });
}

namespace {

// One row of whole_vocab_cross_entropy on one team: its loss, and with grad_scale != 0
// its gradient in place of its logits. row(v) is the row's v-th logit (a reference),
// t its target.
template <class C, class Row>
KOKKOS_INLINE_FUNCTION void row_cross_entropy(const Member& team, const Row& row, std::int64_t cols,
                                              std::int64_t valid, std::int64_t t, C grad_scale,
                                              C& loss) {
  const C m = team_max<C>(team, 0, valid, [&](const std::int64_t v) { return C(row(v)); });
  const bool inside = t >= 0 && t < valid; // outside: no loss term of its own
  const C target = inside ? C(row(t)) - m : C(0);
  team_sync(team); // every thread has read the target logit before it is replaced
  const C sum = team_sum<C>(team, 0, valid, [&](const std::int64_t v) {
    const C e = exp_of<C>(C(row(v)) - m);
    row(v) = e;
    return e;
  });
  team_once(team, [&]() { loss = kmath::log(sum) - target; });
  if (grad_scale == C(0))
    return;
  const C factor = grad_scale / sum;
  team_sync(team); // the exponentials of the whole row are written
  team_for(team, 0, valid, [&](const std::int64_t v) { row(v) = C(row(v)) * factor; });
  team_for(team, valid, cols, [&](const std::int64_t v) { row(v) = C(0); });
  team_sync(team);
  if (inside)
    team_once(team, [&]() { row(t) = C(row(t)) - grad_scale; });
}

} // namespace

template <class T>
void whole_vocab_cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Tokens& targets,
                               std::int64_t valid, const Vec<compute_t<T>>& losses,
                               compute_t<T> grad_scale) {
  using C = compute_t<T>;
  // The three steps above, each row start to finish in one team: the same operations on
  // the same team, so the same bits, while the row stays in cache (one read and one write
  // of the logits instead of three of each).
  const std::int64_t cols = logits.extent(1);
  if constexpr (kOnHost && !std::is_same_v<T, C>) {
    // bf16 on CPUs: the row converted to floats in the thread's scratch, computed there as
    // a float row, and rounded back once. Loops over the bf16 row itself are vectorised
    // at the width of its 2-byte values, which leaves the exponentials too few
    // registers (2.5 times the float row's time), and each gradient would be rounded
    // twice (the exponential, then its product).
    using Row = Kokkos::View<C*, ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
    Kokkos::parallel_for(
        "cubelm::cross_entropy_rows",
        per_row(exec, logits.extent(0), cols)
            .set_scratch_size(1, Kokkos::PerTeam(static_cast<std::size_t>(Row::shmem_size(cols)))),
        [=](const Member& team) {
          const std::int64_t n = team.league_rank();
          const Row row(team.team_scratch(1), cols);
          for (std::int64_t v = 0; v < cols; ++v)
            row(v) = logits(n, v);
          row_cross_entropy<C>(
              team, [&](const std::int64_t v) -> C& { return row(v); }, cols, valid, targets(n),
              grad_scale, losses(n));
          for (std::int64_t v = 0; v < cols; ++v)
            logits(n, v) = row(v);
        });
    return;
  }
  Kokkos::parallel_for(
      "cubelm::cross_entropy_rows", per_row(exec, logits.extent(0), cols),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        row_cross_entropy<C>(
            team, [&](const std::int64_t v) -> T& { return logits(n, v); }, cols, valid, targets(n),
            grad_scale, losses(n));
      });
}

template <class T>
void cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Tokens& targets,
                   const Vec<compute_t<T>>& losses, compute_t<T> grad_scale) {
  whole_vocab_cross_entropy<T>(exec, logits, targets, logits.extent(1), losses, grad_scale);
}

template <class T>
void copy_marked_rows(const ExecSpace& exec, const Mat<T>& logits, const Tokens& marks, int first,
                      std::int64_t valid, const Vec<float>& out) {
  CUBELM_ASSERT(valid <= static_cast<std::int64_t>(logits.extent(1)) &&
                    (valid == 0 || first + valid <= static_cast<std::int64_t>(out.extent(0))),
                "copy_marked_rows: the columns fall outside the logits or the output");
  const std::int64_t rows = logits.extent(0);
  Kokkos::parallel_for(
      "cubelm::copy_marked_rows", Range(exec, 0, rows * valid),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t n = i / valid, v = i % valid;
        if (marks(n) != 0)
          out(first + v) = static_cast<float>(logits(n, v));
      });
}

#define CUBELM_INSTANTIATE_LOSS(T)                                                                 \
  template void row_max<T>(const ExecSpace&, const Mat<T>&, std::int64_t,                          \
                           const Vec<compute_t<T>>&);                                              \
  template void row_sumexp_target<T>(const ExecSpace&, const Mat<T>&, const Vec<compute_t<T>>&,    \
                                     const Tokens&, int, std::int64_t, const Mat<compute_t<T>>&);  \
  template void vocab_cross_entropy<T>(const ExecSpace&, const Mat<T>&, const Mat<compute_t<T>>&,  \
                                       const Tokens&, int, std::int64_t, const Vec<compute_t<T>>&, \
                                       compute_t<T>);                                              \
  template void whole_vocab_cross_entropy<T>(const ExecSpace&, const Mat<T>&, const Tokens&,       \
                                             std::int64_t, const Vec<compute_t<T>>&,               \
                                             compute_t<T>);                                        \
  template void cross_entropy<T>(const ExecSpace&, const Mat<T>&, const Tokens&,                   \
                                 const Vec<compute_t<T>>&, compute_t<T>);                          \
  template void copy_marked_rows<T>(const ExecSpace&, const Mat<T>&, const Tokens&, int,           \
                                    std::int64_t, const Vec<float>&);

CUBELM_INSTANTIATE_LOSS(float)
CUBELM_INSTANTIATE_LOSS(double)
CUBELM_INSTANTIATE_LOSS(bf16)

} // namespace cubelm::kernels
