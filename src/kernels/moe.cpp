// Mixture-of-Experts routing kernels (kernels/moe.hpp). Every kernel works on whole
// rows of one token or one expert row, so nothing needs atomics: the combine and its
// transpose visit a token's k choices in order, and the dispatch places pairs by their
// rank in a stable sort by expert.

#include "cubelm/kernels/moe.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/kernels/vmath.hpp"
#include "ranges.hpp"

#include <string>
#include <type_traits>

namespace cubelm::kernels {

namespace {
template <class T>
Mat<T> matrix(const char* label, std::int64_t rows, std::int64_t cols) {
  return Mat<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
}
} // namespace

template <class T>
MoeSaved<T> MoeSaved<T>::make(std::int64_t n, int experts, int k, std::int64_t rows,
                              std::int64_t hidden, std::int64_t ffn, int peers,
                              std::int64_t received) {
  MoeSaved s;
  const std::int64_t run = peers > 1 ? received : rows;
  s.probs = matrix<compute_t<T>>("cubelm::moe/probs", n, experts);
  s.choice = IntMat("cubelm::moe/choice", n, k);
  s.gate = matrix<compute_t<T>>("cubelm::moe/gate", n, k);
  s.slot = IntMat("cubelm::moe/slot", n, k);
  s.pairs = IntVec("cubelm::moe/pairs", rows);
  s.offsets = IntVec("cubelm::moe/offsets", experts + 1);
  s.fraction = Vec<compute_t<T>>("cubelm::moe/fraction", experts);
  s.h = matrix<T>("cubelm::moe/h", run, ffn);
  s.g = matrix<T>("cubelm::moe/g", run, ffn);
  s.th = matrix<T>("cubelm::moe/gelu_tanh", run, ffn);
  s.out = matrix<T>("cubelm::moe/out", rows, hidden);
  s.host_offsets = Kokkos::View<int*, Kokkos::HostSpace>("cubelm::moe_host_offsets", experts + 1);
  if (peers > 1) {
    s.xr = matrix<T>("cubelm::moe/inputs", received, hidden);
    s.host_received = Kokkos::View<int*, Kokkos::HostSpace>("cubelm::moe_host_received", experts);
  }
  return s;
}

template <class T>
std::int64_t MoeSaved<T>::bytes() const {
  std::int64_t total = 0;
  for_each_buffer([&](const auto& v) {
    total += static_cast<std::int64_t>(v.span() *
                                       sizeof(typename std::decay_t<decltype(v)>::value_type));
  });
  return total;
}

template <class T>
void moe_route(const ExecSpace& exec, const Mat<T>& probs, const IntMat& choice,
               const Mat<T>& gate) {
  const std::int64_t experts = probs.extent(1);
  const int k = choice.extent_int(1);
  Kokkos::parallel_for(
      "cubelm::moe_route", per_row(exec, probs.extent(0), experts),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        const T m =
            team_max<T>(team, 0, experts, [&](const std::int64_t e) { return probs(n, e); });
        team_sync(team); // every thread has read the maximum before the row changes
        const T sum = team_sum<T>(team, 0, experts, [&](const std::int64_t e) {
          const T x = exp_of<T>(probs(n, e) - m);
          probs(n, e) = x;
          return x;
        });
        team_sync(team);
        team_for(team, 0, experts, [&](const std::int64_t e) { probs(n, e) /= sum; });
        team_sync(team);
        team_once(team, [&]() {
          // k passes of an arg-max over the experts not chosen yet; the strict comparison
          // keeps the lowest index among equal probabilities.
          T total = 0;
          for (int j = 0; j < k; ++j) {
            int best = -1;
            for (int e = 0; e < static_cast<int>(experts); ++e) {
              bool taken = false;
              for (int i = 0; i < j; ++i)
                taken = taken || choice(n, i) == e;
              if (!taken && (best < 0 || probs(n, e) > probs(n, best)))
                best = e;
            }
            choice(n, j) = best;
            total += probs(n, best);
          }
          for (int j = 0; j < k; ++j)
            gate(n, j) = probs(n, choice(n, j)) / total;
        });
      });
}

template <class T>
void moe_dispatch(const ExecSpace& exec, const IntMat& choice, std::int64_t capacity,
                  const Tokens& keys, TokenIndexer& sorter, const IntMat& slot, const IntVec& pairs,
                  const IntVec& offsets, const Vec<T>& fraction) {
  const std::int64_t n = choice.extent(0), k = choice.extent(1);
  const int experts = offsets.extent_int(0) - 1;
  Kokkos::parallel_for(
      "cubelm::moe_keys", Range(exec, 0, n * k),
      KOKKOS_LAMBDA(const std::int64_t i) { keys(i) = choice(i % n, i / n); });
  const TokenIndex& index = sorter.build(exec, keys, 0, experts);
  const IntVec sorted = index.positions, starts = index.offsets;
  const std::int64_t cap = capacity < 0 ? n * k : capacity;
  const double pairs_total = static_cast<double>(n * k);
  // Few experts: one work item adds up the kept rows of each.
  Kokkos::parallel_for(
      "cubelm::moe/offsets", Range(exec, 0, 1), KOKKOS_LAMBDA(const std::int64_t) {
        offsets(0) = 0;
        for (int e = 0; e < experts; ++e) {
          const std::int64_t count = starts(e + 1) - starts(e);
          offsets(e + 1) = offsets(e) + static_cast<int>(count < cap ? count : cap);
          fraction(e) = static_cast<T>(static_cast<double>(count) / pairs_total);
        }
      });
  Kokkos::parallel_for(
      "cubelm::moe_place", Range(exec, 0, n * k), KOKKOS_LAMBDA(const std::int64_t i) {
        const int pair = sorted(i);
        const std::int64_t t = pair % n, j = pair / n;
        const int e = choice(t, j);
        const std::int64_t rank = i - starts(e);
        if (rank < cap) {
          const int row = offsets(e) + static_cast<int>(rank);
          slot(t, j) = row;
          pairs(row) = pair;
        } else {
          slot(t, j) = -1;
        }
      });
}

template <class T>
void moe_gather(const ExecSpace& exec, const Mat<T>& x, const IntVec& pairs, std::int64_t rows,
                const Mat<T>& xin) {
  const std::int64_t n = x.extent(0);
  for_each_element(
      "cubelm::moe_gather", exec, rows, x.extent(1),
      KOKKOS_LAMBDA(const std::int64_t r, const std::int64_t c) {
        xin(r, c) = x(pairs(r) % n, c);
      });
}

namespace {

// y[t,:] (= or +=) sum over the kept choices j of weight(t, j) rows[slot(t,j),:]: the gated
// combine and the scatter of the expert inputs' gradient back to their tokens.
template <class T, class Weight>
void sum_kept_choices(const char* name, const ExecSpace& exec, const Mat<T>& rows,
                      const IntMat& slot, Weight weight, bool add, const Mat<T>& y) {
  using C = compute_t<T>;
  const std::int64_t k = slot.extent(1);
  for_each_element(
      name, exec, y.extent(0), y.extent(1),
      KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t c) {
        C sum = 0;
        for (std::int64_t j = 0; j < k; ++j)
          if (slot(t, j) >= 0)
            sum += C(weight(t, j)) * C(rows(slot(t, j), c));
        y(t, c) = add ? C(y(t, c)) + sum : sum;
      });
}

} // namespace

template <class T>
void moe_combine(const ExecSpace& exec, const Mat<T>& out, const IntMat& slot,
                 const Mat<compute_t<T>>& gate, const Mat<T>& y) {
  sum_kept_choices<T>("cubelm::moe_combine", exec, out, slot, gate, false, y);
}

template <class T>
void moe_combine_backward(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& out,
                          const IntMat& slot, const Mat<compute_t<T>>& gate, const IntVec& pairs,
                          std::int64_t rows, const Mat<T>& dout, const Mat<compute_t<T>>& dgate) {
  using C = compute_t<T>;
  const std::int64_t n = dy.extent(0), k = slot.extent(1), cols = dy.extent(1);
  for_each_element(
      "cubelm::moe_dout", exec, rows, cols,
      KOKKOS_LAMBDA(const std::int64_t r, const std::int64_t c) {
        const std::int64_t t = pairs(r) % n, j = pairs(r) / n;
        dout(r, c) = gate(t, j) * C(dy(t, c));
      });
  Kokkos::parallel_for(
      "cubelm::moe_dgate", per_row(exec, n * k, cols), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t i = team.league_rank(), t = i / k, j = i % k;
        const int r = slot(t, j);
        const C dot = r < 0 ? C(0) : team_sum<C>(team, 0, cols, [&](const std::int64_t c) {
          return C(dy(t, c)) * C(out(r, c));
        });
        team_once(team, [&]() { dgate(t, j) = dot; });
      });
}

template <class T>
void moe_scatter_add(const ExecSpace& exec, const Mat<T>& dxin, const IntMat& slot,
                     const Mat<T>& dx) {
  sum_kept_choices<T>(
      "cubelm::moe_scatter_add", exec, dxin, slot,
      KOKKOS_LAMBDA(const std::int64_t, const std::int64_t) { return compute_t<T>(1); }, true, dx);
}

template <class T>
void moe_route_backward(const ExecSpace& exec, const Mat<T>& probs, const IntMat& choice,
                        const Mat<T>& gate, const Mat<T>& dgate, const Vec<T>& fraction,
                        T aux_scale, const Mat<T>& dlogits) {
  const std::int64_t experts = probs.extent(1);
  const int k = choice.extent_int(1);
  Kokkos::parallel_for(
      "cubelm::moe_route_backward", per_row(exec, probs.extent(0), experts),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t n = team.league_rank();
        // gate_j = p_j / S, S the sum of the chosen p: dL/dp_j = (dgate_j - sum_i gate_i
        // dgate_i) / S for a chosen expert; the auxiliary loss adds aux_scale f_e to all.
        team_once(team, [&]() {
          T total = 0, mixed = 0;
          for (int j = 0; j < k; ++j) {
            total += probs(n, choice(n, j));
            mixed += gate(n, j) * dgate(n, j);
          }
          for (std::int64_t e = 0; e < experts; ++e)
            dlogits(n, e) = aux_scale * fraction(e);
          for (int j = 0; j < k; ++j)
            dlogits(n, choice(n, j)) += (dgate(n, j) - mixed) / total;
        });
        team_sync(team);
        // Softmax: dz_e = p_e (dp_e - sum_f p_f dp_f).
        const T dot = team_sum<T>(
            team, 0, experts, [&](const std::int64_t e) { return probs(n, e) * dlogits(n, e); });
        team_sync(team);
        team_for(team, 0, experts, [&](const std::int64_t e) {
          dlogits(n, e) = probs(n, e) * (dlogits(n, e) - dot);
        });
      });
}

template <class T>
void moe_aux_loss(const ExecSpace& exec, const Mat<T>& probs, const Vec<T>& fraction, double scale,
                  const Kokkos::View<double*, MemSpace>& means,
                  const Kokkos::View<double*, MemSpace>& total) {
  const std::int64_t n = probs.extent(0), experts = probs.extent(1);
  Kokkos::parallel_for(
      "cubelm::moe_prob_means", per_row(exec, experts, n), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t e = team.league_rank();
        const double sum = team_sum<double>(
            team, 0, n, [&](const std::int64_t t) { return static_cast<double>(probs(t, e)); });
        team_once(team, [&]() { means(e) = sum / static_cast<double>(n); });
      });
  Kokkos::parallel_for(
      "cubelm::moe_aux_loss", Range(exec, 0, 1), KOKKOS_LAMBDA(const std::int64_t) {
        double sum = 0;
        for (std::int64_t e = 0; e < experts; ++e)
          sum += static_cast<double>(fraction(e)) * means(e);
        total(0) += scale * sum;
      });
}

// The routing (router probabilities, gates, fractions) is computed and kept in float or
// double only: a bf16 model's routes in float.
#define CUBELM_INSTANTIATE_MOE_ROUTING(T)                                                          \
  template void moe_route<T>(const ExecSpace&, const Mat<T>&, const IntMat&, const Mat<T>&);       \
  template void moe_dispatch<T>(const ExecSpace&, const IntMat&, std::int64_t, const Tokens&,      \
                                TokenIndexer&, const IntMat&, const IntVec&, const IntVec&,        \
                                const Vec<T>&);                                                    \
  template void moe_route_backward<T>(const ExecSpace&, const Mat<T>&, const IntMat&,              \
                                      const Mat<T>&, const Mat<T>&, const Vec<T>&, T,              \
                                      const Mat<T>&);                                              \
  template void moe_aux_loss<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&, double,            \
                                const Kokkos::View<double*, MemSpace>&,                            \
                                const Kokkos::View<double*, MemSpace>&);

#define CUBELM_INSTANTIATE_MOE_ROWS(T)                                                             \
  template struct MoeSaved<T>;                                                                     \
  template void moe_gather<T>(const ExecSpace&, const Mat<T>&, const IntVec&, std::int64_t,        \
                              const Mat<T>&);                                                      \
  template void moe_combine<T>(const ExecSpace&, const Mat<T>&, const IntMat&,                     \
                               const Mat<compute_t<T>>&, const Mat<T>&);                           \
  template void moe_combine_backward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,            \
                                        const IntMat&, const Mat<compute_t<T>>&, const IntVec&,    \
                                        std::int64_t, const Mat<T>&, const Mat<compute_t<T>>&);    \
  template void moe_scatter_add<T>(const ExecSpace&, const Mat<T>&, const IntMat&, const Mat<T>&);

CUBELM_INSTANTIATE_MOE_ROUTING(float)
CUBELM_INSTANTIATE_MOE_ROUTING(double)
CUBELM_INSTANTIATE_MOE_ROWS(float)
CUBELM_INSTANTIATE_MOE_ROWS(double)
CUBELM_INSTANTIATE_MOE_ROWS(bf16)

} // namespace cubelm::kernels
