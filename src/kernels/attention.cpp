#include "cubelm/kernels/attention.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/precision.hpp"
#include "cubelm/kernels/vmath.hpp"

#include "gemm_detail.hpp"
#include "ranges.hpp"

#include <atomic>
#include <string>
#include <type_traits>

namespace cubelm::kernels {

namespace {

// probs [B, heads, T, T] as a batch of B * heads [T, T] matrices.
template <class T>
Batch<T> as_batch(const Tensor4<T>& p) {
  return Batch<T>(p.data(), p.extent(0) * p.extent(1), p.extent(2), p.extent(3));
}

// dst(b*heads + h, t, j) = src(b*seq + t, h*d + j)
template <class T>
void to_heads(const ExecSpace& exec, const Mat<T>& src, const Batch<T>& dst, int heads) {
  const std::int64_t d = dst.extent(2);
  const std::int64_t seq = dst.extent(1);
  over_heads(
      "cubelm::attention_to_heads", exec, src.extent(0) / seq, seq, 0, seq, heads, d,
      KOKKOS_LAMBDA(const std::int64_t row, const std::int64_t i, const std::int64_t t,
                    const std::int64_t j,
                    const std::int64_t col) { dst(i, t, j) = src(row, col); });
}

template <class T>
void from_heads(const ExecSpace& exec, const Batch<T>& src, const Mat<T>& dst, int heads) {
  const std::int64_t d = src.extent(2);
  const std::int64_t seq = src.extent(1);
  over_heads(
      "cubelm::attention_from_heads", exec, dst.extent(0) / seq, seq, 0, seq, heads, d,
      KOKKOS_LAMBDA(const std::int64_t row, const std::int64_t i, const std::int64_t t,
                    const std::int64_t j,
                    const std::int64_t col) { dst(row, col) = src(i, t, j); });
}

// Row t of matrix i of p: the causal softmax in place (one team per row); the masked
// upper triangle becomes 0.
template <class T>
KOKKOS_INLINE_FUNCTION void causal_softmax_row(const Member& team, const Batch<T>& p,
                                               std::int64_t i, std::int64_t t, std::int64_t seq) {
  const T mx = team_max<T>(team, 0, t + 1, [&](const std::int64_t s) { return p(i, t, s); });
  const T sum = team_sum<T>(team, 0, t + 1, [&](const std::int64_t s) {
    const T e = exp_of<T>(p(i, t, s) - mx);
    p(i, t, s) = e;
    return e;
  });
  const T inv = T(1) / sum;
  team_sync(team); // the exponentials of the whole row are written
  team_for(team, 0, t + 1, [&](const std::int64_t s) { p(i, t, s) *= inv; });
  team_for(team, t + 1, seq, [&](const std::int64_t s) { p(i, t, s) = T(0); });
}

// Row t of matrix i: dS = P (dP - sum_s P dP) in place of dP; zero where P is masked.
template <class T>
KOKKOS_INLINE_FUNCTION void causal_softmax_backward_row(const Member& team, const Batch<T>& p,
                                                        const Batch<T>& ds, std::int64_t i,
                                                        std::int64_t t, std::int64_t seq) {
  const T dot =
      team_sum<T>(team, 0, t + 1, [&](const std::int64_t s) { return p(i, t, s) * ds(i, t, s); });
  team_for(team, 0, t + 1,
           [&](const std::int64_t s) { ds(i, t, s) = p(i, t, s) * (ds(i, t, s) - dot); });
  team_for(team, t + 1, seq, [&](const std::int64_t s) { ds(i, t, s) = T(0); });
}

std::atomic<bool> g_by_pair{true};

#ifndef KOKKOS_ENABLE_CUDA
// On CPUs, when the batched products would spread whole matrices over the threads
// (as many (sequence, head) pairs as threads or more, and fp32 or fp64 products), the
// attention of one pair runs start to finish on one thread: its products, the same
// single-threaded BLAS calls gemm_batched makes, and its softmax rows while the
// pair's [T, T] matrix is still in that core's cache. The same operations in the
// same order as the separate passes: the same bits, less memory traffic.
template <class T>
bool by_pair_on_host(const ExecSpace& exec, std::int64_t pairs) {
  if (!g_by_pair.load(std::memory_order_relaxed))
    return false;
  if constexpr (std::is_same_v<T, float>)
    if (gemm_precision() == Precision::bf16)
      return false;
  return pairs >= exec.concurrency();
}

#endif

} // namespace

void set_attention_by_pair(bool allowed) {
  g_by_pair.store(allowed, std::memory_order_relaxed);
}

template <class T>
AttentionWorkspace<T>::AttentionWorkspace(int batch, int heads, int seq, int head_dim)
    : q(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::attn_q")),
        batch * heads, seq, head_dim),
      k(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::attn_k")),
        batch * heads, seq, head_dim),
      v(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::attn_v")),
        batch * heads, seq, head_dim),
      o(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::attn_o")),
        batch * heads, seq, head_dim) {}

template <class T>
void attention_forward(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                       int heads, const Tensor4<T>& probs, const AttentionWorkspace<T>& work,
                       const Mat<T>& out) {
  const std::int64_t batch = probs.extent(0);
  const std::int64_t seq = probs.extent(2);
  const std::int64_t d = static_cast<std::int64_t>(q.extent(1)) / heads;
  CUBELM_ASSERT(static_cast<std::int64_t>(q.extent(0)) == batch * seq &&
                    static_cast<std::int64_t>(probs.extent(1)) == heads &&
                    static_cast<std::int64_t>(work.q.extent(0)) == batch * heads,
                "attention_forward: probs must be [B, heads, T, T] with B*T rows of q");
  const T scale = T(1) / kmath::sqrt(T(d));
  const Batch<T> p = as_batch(probs);
#ifndef KOKKOS_ENABLE_CUDA
  if (by_pair_on_host<T>(exec, batch * heads)) {
    // Pair i = (sequence b, head h) reads its d columns of q, k, v in place (leading
    // dimension H) and writes its columns of out.
    const int t = static_cast<int>(seq), dd = static_cast<int>(d);
    const int ld = static_cast<int>(q.stride(0)), ldo = static_cast<int>(out.stride(0));
    CUBELM_ASSERT(k.stride(0) == q.stride(0) && v.stride(0) == q.stride(0),
                  "attention_forward: q, k and v must have the same row stride");
    const T *qd = q.data(), *kd = k.data(), *vd = v.data();
    T *pd = p.data(), *od = out.data();
    Kokkos::parallel_for(
        "cubelm::attention_pairs", per_row(exec, batch * heads, seq * seq),
        KOKKOS_LAMBDA(const Member& team) {
          const std::int64_t i = team.league_rank();
          const std::int64_t in = (i / heads) * seq * ld + (i % heads) * d;
          T* pi = pd + i * seq * seq;
          detail::host_gemm<T>(false, true, t, t, dd, scale, qd + in, ld, kd + in, ld, T(0), pi, t);
          for (std::int64_t r = 0; r < seq; ++r)
            causal_softmax_row<T>(team, p, i, r, seq);
          detail::host_gemm<T>(false, false, t, dd, t, T(1), pi, t, vd + in, ld, T(0),
                               od + (i / heads) * seq * ldo + (i % heads) * d, ldo);
        });
    return;
  }
#endif
  to_heads<T>(exec, q, work.q, heads);
  to_heads<T>(exec, k, work.k, heads);
  to_heads<T>(exec, v, work.v, heads);
  gemm_batched<T>(exec, false, true, scale, work.q, work.k, T(0), p); // scores = q k^T / sqrt(d)
  Kokkos::parallel_for(
      "cubelm::attention_softmax", per_row(exec, batch * heads * seq, seq),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        causal_softmax_row<T>(team, p, r / seq, r % seq, seq);
      });
  gemm_batched<T>(exec, false, false, T(1), p, work.v, T(0), work.o); // out = P v
  from_heads<T>(exec, work.o, out, heads);
}

template <class T>
void attention_backward(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                        int heads, const Tensor4<T>& probs, const Mat<T>& dout,
                        const Tensor4<T>& scratch, const AttentionWorkspace<T>& work,
                        const Mat<T>& dq, const Mat<T>& dk, const Mat<T>& dv) {
  const std::int64_t batch = probs.extent(0);
  const std::int64_t seq = probs.extent(2);
  const std::int64_t n = batch * heads;
  const T scale = T(1) / kmath::sqrt(T(static_cast<std::int64_t>(q.extent(1)) / heads));
  const Batch<T> p = as_batch(probs), ds = as_batch(scratch);
#ifndef KOKKOS_ENABLE_CUDA
  if (by_pair_on_host<T>(exec, n)) {
    // As in the forward: each pair's columns of q, k, v, dout and of the gradients in place.
    const std::int64_t d = static_cast<std::int64_t>(q.extent(1)) / heads;
    const int t = static_cast<int>(seq), dd = static_cast<int>(d);
    const int ld = static_cast<int>(q.stride(0));
    CUBELM_ASSERT(k.stride(0) == q.stride(0) && v.stride(0) == q.stride(0) &&
                      dout.stride(0) == q.stride(0) && dq.stride(0) == q.stride(0) &&
                      dk.stride(0) == q.stride(0) && dv.stride(0) == q.stride(0),
                  "attention_backward: q, k, v, dout and the gradients must have the same row "
                  "stride");
    const T *qd = q.data(), *kd = k.data(), *vd = v.data(), *pd = p.data(), *gd = dout.data();
    T *sd = ds.data(), *dqd = dq.data(), *dkd = dk.data(), *dvd = dv.data();
    Kokkos::parallel_for(
        "cubelm::attention_pairs_backward", per_row(exec, n, seq * seq),
        KOKKOS_LAMBDA(const Member& team) {
          const std::int64_t i = team.league_rank();
          const std::int64_t in = (i / heads) * seq * ld + (i % heads) * d;
          const T* pi = pd + i * seq * seq;
          T* si = sd + i * seq * seq;
          detail::host_gemm<T>(false, true, t, t, dd, T(1), gd + in, ld, vd + in, ld, T(0), si,
                               t); // dP = dO v^T
          for (std::int64_t r = 0; r < seq; ++r)
            causal_softmax_backward_row<T>(team, p, ds, i, r, seq);
          detail::host_gemm<T>(true, false, t, dd, t, T(1), pi, t, gd + in, ld, T(0), dvd + in,
                               ld); // dv = P^T dO
          detail::host_gemm<T>(false, false, t, dd, t, scale, si, t, kd + in, ld, T(0), dqd + in,
                               ld); // dq = dS k / sqrt(d)
          detail::host_gemm<T>(true, false, t, dd, t, scale, si, t, qd + in, ld, T(0), dkd + in,
                               ld); // dk = dS^T q / sqrt(d)
        });
    return;
  }
#endif
  // The workspace is shared by all layers: gather this layer's q, k, v again.
  to_heads<T>(exec, q, work.q, heads);
  to_heads<T>(exec, k, work.k, heads);
  to_heads<T>(exec, v, work.v, heads);
  to_heads<T>(exec, dout, work.o, heads);
  gemm_batched<T>(exec, false, true, T(1), work.o, work.v, T(0), ds); // dP = dO v^T
  Kokkos::parallel_for(
      "cubelm::attention_softmax_backward", per_row(exec, n * seq, seq),
      KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        causal_softmax_backward_row<T>(team, p, ds, r / seq, r % seq, seq);
      });
  // Each product after the softmax overwrites a buffer whose old content is no longer
  // needed: dv = P^T dO replaces v, dq = dS k / sqrt(d) replaces dO, dk = dS^T q / sqrt(d)
  // replaces k.
  gemm_batched<T>(exec, true, false, T(1), p, work.o, T(0), work.v);
  gemm_batched<T>(exec, false, false, scale, ds, work.k, T(0), work.o);
  gemm_batched<T>(exec, true, false, scale, ds, work.q, T(0), work.k);
  from_heads<T>(exec, work.o, dq, heads);
  from_heads<T>(exec, work.k, dk, heads);
  from_heads<T>(exec, work.v, dv, heads);
}

#define CUBELM_INSTANTIATE_ATTENTION(T)                                                            \
  template struct AttentionWorkspace<T>;                                                           \
  template void attention_forward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,               \
                                     const Mat<T>&, int, const Tensor4<T>&,                        \
                                     const AttentionWorkspace<T>&, const Mat<T>&);                 \
  template void attention_backward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,              \
                                      const Mat<T>&, int, const Tensor4<T>&, const Mat<T>&,        \
                                      const Tensor4<T>&, const AttentionWorkspace<T>&,             \
                                      const Mat<T>&, const Mat<T>&, const Mat<T>&);

CUBELM_INSTANTIATE_ATTENTION(float)
CUBELM_INSTANTIATE_ATTENTION(double)

} // namespace cubelm::kernels
