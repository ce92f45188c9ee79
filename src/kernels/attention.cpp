#include "cubelm/kernels/attention.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"

namespace cubelm::kernels {

namespace {
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
}

template <class T>
void attention_forward(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                       int heads, const Tensor4<T>& probs, const Mat<T>& out) {
  const std::int64_t batch = probs.extent(0);
  const std::int64_t seq = probs.extent(2);
  const std::int64_t d = static_cast<std::int64_t>(q.extent(1)) / heads;
  CUBELM_ASSERT(static_cast<std::int64_t>(q.extent(0)) == batch * seq &&
                    static_cast<std::int64_t>(probs.extent(1)) == heads,
                "attention_forward: probs must be [B, heads, T, T] with B*T rows of q");
  const T scale = T(1) / kmath::sqrt(T(d));
  Kokkos::parallel_for(
      "cubelm::attention_forward", Range(exec, 0, batch * heads * seq),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t t = i % seq;
        const std::int64_t h = (i / seq) % heads;
        const std::int64_t b = i / (seq * heads);
        const std::int64_t row = b * seq + t;
        T mx = 0;
        for (std::int64_t s = 0; s <= t; ++s) {
          T score = 0;
          for (std::int64_t j = 0; j < d; ++j)
            score += q(row, h * d + j) * k(b * seq + s, h * d + j);
          score *= scale;
          probs(b, h, t, s) = score;
          mx = (s == 0 || score > mx) ? score : mx;
        }
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
        for (std::int64_t j = 0; j < d; ++j) {
          T acc = 0;
          for (std::int64_t s = 0; s <= t; ++s)
            acc += probs(b, h, t, s) * v(b * seq + s, h * d + j);
          out(row, h * d + j) = acc;
        }
      });
}

template <class T>
void attention_backward(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                        int heads, const Tensor4<T>& probs, const Mat<T>& dout,
                        const Tensor4<T>& scratch, const Mat<T>& dq, const Mat<T>& dk,
                        const Mat<T>& dv) {
  const std::int64_t batch = probs.extent(0);
  const std::int64_t seq = probs.extent(2);
  const std::int64_t d = static_cast<std::int64_t>(q.extent(1)) / heads;
  const T scale = T(1) / kmath::sqrt(T(d));
  // Row t of each head: dP = dout v^T, dS = P (dP - sum_s P dP), dq = scale dS k.
  Kokkos::parallel_for(
      "cubelm::attention_backward_q", Range(exec, 0, batch * heads * seq),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t t = i % seq;
        const std::int64_t h = (i / seq) % heads;
        const std::int64_t b = i / (seq * heads);
        const std::int64_t row = b * seq + t;
        T dot = 0;
        for (std::int64_t s = 0; s <= t; ++s) {
          T dp = 0;
          for (std::int64_t j = 0; j < d; ++j)
            dp += dout(row, h * d + j) * v(b * seq + s, h * d + j);
          scratch(b, h, t, s) = dp;
          dot += probs(b, h, t, s) * dp;
        }
        for (std::int64_t s = 0; s <= t; ++s)
          scratch(b, h, t, s) = probs(b, h, t, s) * (scratch(b, h, t, s) - dot);
        for (std::int64_t j = 0; j < d; ++j) {
          T acc = 0;
          for (std::int64_t s = 0; s <= t; ++s)
            acc += scratch(b, h, t, s) * k(b * seq + s, h * d + j);
          dq(row, h * d + j) = scale * acc;
        }
      });
  // Column s of each head: dk = scale dS^T q, dv = P^T dout (sums over t >= s).
  Kokkos::parallel_for(
      "cubelm::attention_backward_kv", Range(exec, 0, batch * heads * seq),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t s = i % seq;
        const std::int64_t h = (i / seq) % heads;
        const std::int64_t b = i / (seq * heads);
        const std::int64_t row = b * seq + s;
        for (std::int64_t j = 0; j < d; ++j) {
          T acc_k = 0, acc_v = 0;
          for (std::int64_t t = s; t < seq; ++t) {
            acc_k += scratch(b, h, t, s) * q(b * seq + t, h * d + j);
            acc_v += probs(b, h, t, s) * dout(b * seq + t, h * d + j);
          }
          dk(row, h * d + j) = scale * acc_k;
          dv(row, h * d + j) = acc_v;
        }
      });
}

#define CUBELM_INSTANTIATE_ATTENTION(T)                                                            \
  template void attention_forward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,               \
                                     const Mat<T>&, int, const Tensor4<T>&, const Mat<T>&);        \
  template void attention_backward<T>(                                                             \
      const ExecSpace&, const Mat<T>&, const Mat<T>&, const Mat<T>&, int, const Tensor4<T>&,       \
      const Mat<T>&, const Tensor4<T>&, const Mat<T>&, const Mat<T>&, const Mat<T>&);

CUBELM_INSTANTIATE_ATTENTION(float)
CUBELM_INSTANTIATE_ATTENTION(double)

} // namespace cubelm::kernels
