// Causal attention over blocks of the sequence (docs/kernels.md, "Attention over blocks
// of the sequence"): the products are batched gemms over every (sequence, head), the
// softmax parts one team per query row, as in attention.cpp.

#include "cubelm/kernels/attention_blocks.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/kernels/vmath.hpp"

#include "ranges.hpp"

#include <limits>
#include <string>

namespace cubelm::kernels {

namespace {

std::string dims(const char* name, std::size_t a, std::size_t b, std::size_t c) {
  return std::string(name) + " [" + std::to_string(a) + ", " + std::to_string(b) + ", " +
         std::to_string(c) + "]";
}

template <class T>
void check_pair(const char* op, const Batch<T>& q, const Batch<T>& k, const Batch<T>& v,
                const Batch<T>& scores) {
  const bool ok = k.extent(0) == q.extent(0) && v.extent(0) == q.extent(0) &&
                  k.extent(2) == q.extent(2) && v.extent(2) == q.extent(2) &&
                  v.extent(1) == k.extent(1) && scores.extent(0) == q.extent(0) &&
                  scores.extent(1) == q.extent(1) && scores.extent(2) == k.extent(1);
  CUBELM_ASSERT(ok, std::string(op) + ": blocks must be q [n, Tq, d], k and v [n, Tk, d], " +
                        "scores [n, Tq, Tk]; got " +
                        dims("q", q.extent(0), q.extent(1), q.extent(2)) + ", " +
                        dims("k", k.extent(0), k.extent(1), k.extent(2)) + ", " +
                        dims("v", v.extent(0), v.extent(1), v.extent(2)) + ", " +
                        dims("scores", scores.extent(0), scores.extent(1), scores.extent(2)));
}

template <class T>
void check_rows(const char* op, const Batch<T>& block, const Mat<T>& per_row) {
  CUBELM_ASSERT(per_row.extent(0) == block.extent(0) && per_row.extent(1) == block.extent(1),
                std::string(op) + ": a value per query row [n, Tq] is needed for " +
                    dims("the block", block.extent(0), block.extent(1), block.extent(2)) +
                    ", got [" + std::to_string(per_row.extent(0)) + ", " +
                    std::to_string(per_row.extent(1)) + "]");
}

// The number of keys of a block at k_offset (k_len keys) that the query at global
// position `pos` sees: the keys at positions <= pos.
KOKKOS_INLINE_FUNCTION std::int64_t visible(std::int64_t pos, std::int64_t k_offset,
                                            std::int64_t k_len) {
  const std::int64_t c = pos - k_offset + 1;
  return c < 0 ? 0 : (c > k_len ? k_len : c);
}

template <class T>
T minus_infinity() {
  return -std::numeric_limits<T>::infinity();
}

} // namespace

BlockMask block_mask(std::int64_t q_offset, std::int64_t q_len, std::int64_t k_offset,
                     std::int64_t k_len) {
  if (q_len <= 0 || k_len <= 0 || k_offset > q_offset + q_len - 1)
    return BlockMask::skip;
  if (k_offset + k_len - 1 <= q_offset)
    return BlockMask::full;
  return BlockMask::partial;
}

template <class T>
BlockMask attention_block_forward(const ExecSpace& exec, const Batch<T>& q, const Batch<T>& k,
                                  const Batch<T>& v, std::int64_t q_offset, std::int64_t k_offset,
                                  const Batch<T>& scores, const Batch<T>& out, const Mat<T>& lse) {
  check_pair("attention_block_forward", q, k, v, scores);
  CUBELM_ASSERT(out.extent(0) == q.extent(0) && out.extent(1) == q.extent(1) &&
                    out.extent(2) == q.extent(2),
                "attention_block_forward: out must have the shape of q");
  check_rows("attention_block_forward", q, lse);
  const std::int64_t n = q.extent(0), tq = q.extent(1), tk = k.extent(1), d = q.extent(2);
  const T neg_inf = minus_infinity<T>();
  const BlockMask mask = block_mask(q_offset, tq, k_offset, tk);
  if (mask == BlockMask::skip) {
    // Nothing is visible: the neutral element of attention_combine.
    for_each_element(
        "cubelm::attention_block_skip", exec, n * tq, d,
        KOKKOS_LAMBDA(const std::int64_t r, const std::int64_t j) {
          out(r / tq, r % tq, j) = T(0);
          if (j == 0)
            lse(r / tq, r % tq) = neg_inf;
        });
    return mask;
  }
  const T scale = T(1) / kmath::sqrt(T(d));
  gemm_batched<T>(exec, false, true, scale, q, k, T(0), scores); // q k^T / sqrt(d)
  // The softmax of each row over its visible keys, in place; masked keys become 0.
  Kokkos::parallel_for(
      "cubelm::attention_block_softmax", per_row(exec, n * tq, tk),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t i = r / tq, t = r % tq;
        const std::int64_t seen = visible(q_offset + t, k_offset, tk);
        if (seen == 0) {
          team_for(team, 0, tk, [&](const std::int64_t s) { scores(i, t, s) = T(0); });
          team_once(team, [&]() { lse(i, t) = neg_inf; });
          return;
        }
        const T mx =
            team_max<T>(team, 0, seen, [&](const std::int64_t s) { return scores(i, t, s); });
        const T sum = team_sum<T>(team, 0, seen, [&](const std::int64_t s) {
          const T e = exp_of<T>(scores(i, t, s) - mx);
          scores(i, t, s) = e;
          return e;
        });
        const T inv = T(1) / sum;
        team_sync(team); // the exponentials of the whole row are written
        team_for(team, 0, seen, [&](const std::int64_t s) { scores(i, t, s) *= inv; });
        team_for(team, seen, tk, [&](const std::int64_t s) { scores(i, t, s) = T(0); });
        team_once(team, [&]() { lse(i, t) = mx + kmath::log(sum); });
      });
  gemm_batched<T>(exec, false, false, T(1), scores, v, T(0), out); // P v
  return mask;
}

template <class T>
void attention_combine(const ExecSpace& exec, const Batch<T>& out_a, const Mat<T>& lse_a,
                       const Batch<T>& out_b, const Mat<T>& lse_b) {
  CUBELM_ASSERT(out_b.extent(0) == out_a.extent(0) && out_b.extent(1) == out_a.extent(1) &&
                    out_b.extent(2) == out_a.extent(2),
                "attention_combine: the two partial outputs must have the same shape");
  check_rows("attention_combine", out_a, lse_a);
  check_rows("attention_combine", out_b, lse_b);
  const std::int64_t tq = out_a.extent(1), d = out_a.extent(2);
  const T neg_inf = minus_infinity<T>();
  Kokkos::parallel_for(
      "cubelm::attention_combine", per_row(exec, out_a.extent(0) * tq, d),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t i = r / tq, t = r % tq;
        const T la = lse_a(i, t), lb = lse_b(i, t);
        const T m = la > lb ? la : lb;
        if (m == neg_inf)
          return; // neither part sees a key: (0, -inf) stays
        // exp(-inf) = 0: a part that sees nothing gets no weight.
        const T wa = exp_of<T>(la - m), wb = exp_of<T>(lb - m);
        const T inv = T(1) / (wa + wb);
        team_for(team, 0, d, [&](const std::int64_t j) {
          out_a(i, t, j) = (wa * out_a(i, t, j) + wb * out_b(i, t, j)) * inv;
        });
        team_sync(team); // every thread has read lse_a(i, t)
        team_once(team, [&]() { lse_a(i, t) = m + kmath::log(wa + wb); });
      });
}

template <class T>
void attention_block_delta(const ExecSpace& exec, const Batch<T>& out, const Batch<T>& dout,
                           const Mat<T>& delta) {
  CUBELM_ASSERT(dout.extent(0) == out.extent(0) && dout.extent(1) == out.extent(1) &&
                    dout.extent(2) == out.extent(2),
                "attention_block_delta: dout must have the shape of out");
  check_rows("attention_block_delta", out, delta);
  const std::int64_t tq = out.extent(1), d = out.extent(2);
  Kokkos::parallel_for(
      "cubelm::attention_block_delta", per_row(exec, out.extent(0) * tq, d),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t i = r / tq, t = r % tq;
        const T sum = team_sum<T>(
            team, 0, d, [&](const std::int64_t j) { return dout(i, t, j) * out(i, t, j); });
        team_once(team, [&]() { delta(i, t) = sum; });
      });
}

template <class T>
BlockMask attention_block_backward(const ExecSpace& exec, const Batch<T>& q, const Batch<T>& k,
                                   const Batch<T>& v, const Batch<T>& dout, const Mat<T>& lse,
                                   const Mat<T>& delta, std::int64_t q_offset,
                                   std::int64_t k_offset, const Batch<T>& probs,
                                   const Batch<T>& dscores, const Batch<T>& dq, const Batch<T>& dk,
                                   const Batch<T>& dv) {
  check_pair("attention_block_backward", q, k, v, probs);
  check_pair("attention_block_backward", q, k, v, dscores);
  check_rows("attention_block_backward", q, lse);
  check_rows("attention_block_backward", q, delta);
  CUBELM_ASSERT(dout.extent(0) == q.extent(0) && dout.extent(1) == q.extent(1) &&
                    dout.extent(2) == q.extent(2) && dq.extent(0) == q.extent(0) &&
                    dq.extent(1) == q.extent(1) && dq.extent(2) == q.extent(2) &&
                    dk.extent(0) == k.extent(0) && dk.extent(1) == k.extent(1) &&
                    dk.extent(2) == k.extent(2) && dv.extent(0) == v.extent(0) &&
                    dv.extent(1) == v.extent(1) && dv.extent(2) == v.extent(2),
                "attention_block_backward: dout and dq must have the shape of q, dk of k, dv of v");
  const std::int64_t n = q.extent(0), tq = q.extent(1), tk = k.extent(1), d = q.extent(2);
  const BlockMask mask = block_mask(q_offset, tq, k_offset, tk);
  if (mask == BlockMask::skip)
    return mask;
  const T scale = T(1) / kmath::sqrt(T(d));
  gemm_batched<T>(exec, false, true, scale, q, k, T(0), probs);     // scores
  gemm_batched<T>(exec, false, true, T(1), dout, v, T(0), dscores); // dP = dO v^T
  // P = exp(score - lse) with the final lse of the row, dS = P (dP - delta); 0 where masked.
  Kokkos::parallel_for(
      "cubelm::attention_block_softmax_backward", per_row(exec, n * tq, tk),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t i = r / tq, t = r % tq;
        const std::int64_t seen = visible(q_offset + t, k_offset, tk);
        const T l = lse(i, t), dl = delta(i, t);
        team_for(team, 0, seen, [&](const std::int64_t s) {
          const T p = exp_of<T>(probs(i, t, s) - l);
          probs(i, t, s) = p;
          dscores(i, t, s) = p * (dscores(i, t, s) - dl);
        });
        team_for(team, seen, tk, [&](const std::int64_t s) {
          probs(i, t, s) = T(0);
          dscores(i, t, s) = T(0);
        });
      });
  gemm_batched<T>(exec, true, false, T(1), probs, dout, T(1), dv);  // dv += P^T dO
  gemm_batched<T>(exec, false, false, scale, dscores, k, T(1), dq); // dq += dS k / sqrt(d)
  gemm_batched<T>(exec, true, false, scale, dscores, q, T(1), dk);  // dk += dS^T q / sqrt(d)
  return mask;
}

template <class T>
void gather_heads(const ExecSpace& exec, const Mat<T>& src, int heads, std::int64_t t_begin,
                  const Batch<compute_t<T>>& dst) {
  const std::int64_t len = dst.extent(1), d = dst.extent(2);
  const std::int64_t batch = static_cast<std::int64_t>(dst.extent(0)) / heads;
  const std::int64_t seq = batch > 0 ? static_cast<std::int64_t>(src.extent(0)) / batch : 0;
  CUBELM_ASSERT(batch * heads == static_cast<std::int64_t>(dst.extent(0)) &&
                    batch * seq == static_cast<std::int64_t>(src.extent(0)) &&
                    static_cast<std::int64_t>(src.extent(1)) == heads * d && t_begin >= 0 &&
                    t_begin + len <= seq,
                "gather_heads: the block [B * heads, len, d] must hold positions of the B "
                "sequences of a [B * seq, heads * d] matrix");
  over_heads(
      "cubelm::attention_gather_heads", exec, batch, seq, t_begin, len, heads, d,
      KOKKOS_LAMBDA(const std::int64_t row, const std::int64_t i, const std::int64_t t,
                    const std::int64_t j,
                    const std::int64_t col) { dst(i, t, j) = src(row, col); });
}

template <class T>
void scatter_heads(const ExecSpace& exec, const Batch<compute_t<T>>& src, int heads,
                   std::int64_t t_begin, const Mat<T>& dst, bool accumulate) {
  using C = compute_t<T>;
  const std::int64_t len = src.extent(1), d = src.extent(2);
  const std::int64_t batch = static_cast<std::int64_t>(src.extent(0)) / heads;
  const std::int64_t seq = batch > 0 ? static_cast<std::int64_t>(dst.extent(0)) / batch : 0;
  CUBELM_ASSERT(batch * heads == static_cast<std::int64_t>(src.extent(0)) &&
                    batch * seq == static_cast<std::int64_t>(dst.extent(0)) &&
                    static_cast<std::int64_t>(dst.extent(1)) == heads * d && t_begin >= 0 &&
                    t_begin + len <= seq,
                "scatter_heads: the block [B * heads, len, d] must hold positions of the B "
                "sequences of a [B * seq, heads * d] matrix");
  over_heads(
      "cubelm::attention_scatter_heads", exec, batch, seq, t_begin, len, heads, d,
      KOKKOS_LAMBDA(const std::int64_t row, const std::int64_t i, const std::int64_t t,
                    const std::int64_t j, const std::int64_t col) {
        T& x = dst(row, col);
        x = accumulate ? C(x) + src(i, t, j) : src(i, t, j);
      });
}

#define CUBELM_INSTANTIATE_HEAD_BLOCKS(T)                                                          \
  template void gather_heads<T>(const ExecSpace&, const Mat<T>&, int, std::int64_t,                \
                                const Batch<compute_t<T>>&);                                       \
  template void scatter_heads<T>(const ExecSpace&, const Batch<compute_t<T>>&, int, std::int64_t,  \
                                 const Mat<T>&, bool);

#define CUBELM_INSTANTIATE_ATTENTION_BLOCKS(T)                                                     \
  template BlockMask attention_block_forward<T>(                                                   \
      const ExecSpace&, const Batch<T>&, const Batch<T>&, const Batch<T>&, std::int64_t,           \
      std::int64_t, const Batch<T>&, const Batch<T>&, const Mat<T>&);                              \
  template void attention_combine<T>(const ExecSpace&, const Batch<T>&, const Mat<T>&,             \
                                     const Batch<T>&, const Mat<T>&);                              \
  template void attention_block_delta<T>(const ExecSpace&, const Batch<T>&, const Batch<T>&,       \
                                         const Mat<T>&);                                           \
  template BlockMask attention_block_backward<T>(                                                  \
      const ExecSpace&, const Batch<T>&, const Batch<T>&, const Batch<T>&, const Batch<T>&,        \
      const Mat<T>&, const Mat<T>&, std::int64_t, std::int64_t, const Batch<T>&, const Batch<T>&,  \
      const Batch<T>&, const Batch<T>&, const Batch<T>&);                                          \
  CUBELM_INSTANTIATE_HEAD_BLOCKS(T)

CUBELM_INSTANTIATE_ATTENTION_BLOCKS(float)
CUBELM_INSTANTIATE_ATTENTION_BLOCKS(double)
CUBELM_INSTANTIATE_HEAD_BLOCKS(bf16)

} // namespace cubelm::kernels
