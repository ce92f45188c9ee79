#include "cubelm/kernels/attention.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/kernels/blas.hpp"

#include <string>

namespace cubelm::kernels {

namespace {

using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
using Range3 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, Kokkos::IndexType<std::int64_t>>;
template <class T>
using Cube = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace>;

// Matrix i of a [n, rows, cols] cube, as an unmanaged [rows, cols] view.
template <class T>
Mat<T> slice(const Cube<T>& c, std::int64_t i) {
  return Mat<T>(c.data() + i * c.extent(1) * c.extent(2), c.extent(1), c.extent(2));
}
// probs(b, h, :, :) as a [T, T] view.
template <class T>
Mat<T> slice(const Tensor4<T>& p, std::int64_t i) {
  return Mat<T>(p.data() + i * p.extent(2) * p.extent(3), p.extent(2), p.extent(3));
}

// dst(b*heads + h, t, j) = src(b*seq + t, h*d + j)
template <class T>
void to_heads(const ExecSpace& exec, const Mat<T>& src, const Cube<T>& dst, int heads) {
  const std::int64_t seq = dst.extent(1), d = dst.extent(2);
  Kokkos::parallel_for(
      "cubelm::attention_to_heads",
      Range3(exec, {0, 0, 0}, {static_cast<std::int64_t>(dst.extent(0)), seq, d}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t t, const std::int64_t j) {
        const std::int64_t b = i / heads, h = i % heads;
        dst(i, t, j) = src(b * seq + t, h * d + j);
      });
}

template <class T>
void from_heads(const ExecSpace& exec, const Cube<T>& src, const Mat<T>& dst, int heads) {
  const std::int64_t seq = src.extent(1), d = src.extent(2);
  Kokkos::parallel_for(
      "cubelm::attention_from_heads",
      Range3(exec, {0, 0, 0}, {static_cast<std::int64_t>(src.extent(0)), seq, d}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t t, const std::int64_t j) {
        const std::int64_t b = i / heads, h = i % heads;
        dst(b * seq + t, h * d + j) = src(i, t, j);
      });
}

} // namespace

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
  to_heads<T>(exec, q, work.q, heads);
  to_heads<T>(exec, k, work.k, heads);
  to_heads<T>(exec, v, work.v, heads);
  for (std::int64_t i = 0; i < batch * heads; ++i) // scores = q k^T / sqrt(d)
    gemm<T>(exec, false, true, scale, slice(work.q, i), slice(work.k, i), T(0), slice(probs, i));
  // Causal softmax of every row in place; the masked upper triangle becomes 0.
  Kokkos::parallel_for(
      "cubelm::attention_softmax", Range(exec, 0, batch * heads * seq),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const std::int64_t t = r % seq;
        const std::int64_t h = (r / seq) % heads;
        const std::int64_t b = r / (seq * heads);
        T mx = probs(b, h, t, 0);
        for (std::int64_t s = 1; s <= t; ++s)
          mx = probs(b, h, t, s) > mx ? probs(b, h, t, s) : mx;
        T sum = 0;
        for (std::int64_t s = 0; s <= t; ++s) {
          const T e = kmath::exp(probs(b, h, t, s) - mx);
          probs(b, h, t, s) = e;
          sum += e;
        }
        const T inv = T(1) / sum;
        for (std::int64_t s = 0; s <= t; ++s)
          probs(b, h, t, s) *= inv;
        for (std::int64_t s = t + 1; s < seq; ++s)
          probs(b, h, t, s) = 0;
      });
  for (std::int64_t i = 0; i < batch * heads; ++i) // out = P v
    gemm<T>(exec, false, false, T(1), slice(probs, i), slice(work.v, i), T(0), slice(work.o, i));
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
  // The workspace is shared by all layers: gather this layer's q, k, v again.
  to_heads<T>(exec, q, work.q, heads);
  to_heads<T>(exec, k, work.k, heads);
  to_heads<T>(exec, v, work.v, heads);
  to_heads<T>(exec, dout, work.o, heads);
  for (std::int64_t i = 0; i < n; ++i) // dP = dO v^T
    gemm<T>(exec, false, true, T(1), slice(work.o, i), slice(work.v, i), T(0), slice(scratch, i));
  // dS = P (dP - sum_s P dP), row by row; zero where P is masked.
  Kokkos::parallel_for(
      "cubelm::attention_softmax_backward", Range(exec, 0, n * seq),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const std::int64_t t = r % seq;
        const std::int64_t h = (r / seq) % heads;
        const std::int64_t b = r / (seq * heads);
        T dot = 0;
        for (std::int64_t s = 0; s <= t; ++s)
          dot += probs(b, h, t, s) * scratch(b, h, t, s);
        for (std::int64_t s = 0; s <= t; ++s)
          scratch(b, h, t, s) = probs(b, h, t, s) * (scratch(b, h, t, s) - dot);
        for (std::int64_t s = t + 1; s < seq; ++s)
          scratch(b, h, t, s) = 0;
      });
  // Each product overwrites a buffer whose old content is no longer needed:
  // dv = P^T dO replaces v, dq = dS k / sqrt(d) replaces dO, dk = dS^T q / sqrt(d) replaces k.
  for (std::int64_t i = 0; i < n; ++i)
    gemm<T>(exec, true, false, T(1), slice(probs, i), slice(work.o, i), T(0), slice(work.v, i));
  for (std::int64_t i = 0; i < n; ++i)
    gemm<T>(exec, false, false, scale, slice(scratch, i), slice(work.k, i), T(0), slice(work.o, i));
  for (std::int64_t i = 0; i < n; ++i)
    gemm<T>(exec, true, false, scale, slice(scratch, i), slice(work.q, i), T(0), slice(work.k, i));
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
