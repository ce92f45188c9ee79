#include "cubelm/kernels/layers.hpp"

#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"

#include <string>

namespace cubelm::kernels {

namespace {
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
using Range2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;

Range2 over(const ExecSpace& exec, std::int64_t rows, std::int64_t cols) {
  return Range2(exec, {0, 0}, {rows, cols});
}

// Columns summed together by one work item of a column reduction: enough for
// whole cache lines per row, few enough to keep the partial sums in registers.
constexpr std::int64_t kColumnChunk = 32;
} // namespace

TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int vocab) {
  for (const std::int32_t t : tokens)
    CUBELM_ASSERT(t >= 0 && t < vocab, "token " + std::to_string(t) + " outside the vocabulary");
  return make_token_index(tokens, 0, vocab);
}

TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int first, int count) {
  TokenIndex index;
  index.offsets = Kokkos::View<int*, MemSpace>("cubelm::token_offsets", count + 1);
  auto offsets = Kokkos::create_mirror_view(index.offsets);
  Kokkos::deep_copy(offsets, 0);
  std::size_t kept = 0;
  for (const std::int32_t t : tokens)
    if (t >= first && t < first + count) {
      offsets(t - first + 1) += 1;
      ++kept;
    }
  for (int v = 0; v < count; ++v)
    offsets(v + 1) += offsets(v);
  index.positions = Kokkos::View<int*, MemSpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::token_positions")),
      kept);
  auto positions = Kokkos::create_mirror_view(index.positions);
  std::vector<int> next(offsets.data(), offsets.data() + count);
  for (std::size_t n = 0; n < tokens.size(); ++n)
    if (tokens[n] >= first && tokens[n] < first + count)
      positions(next[tokens[n] - first]++) = static_cast<int>(n);
  Kokkos::deep_copy(index.offsets, offsets);
  Kokkos::deep_copy(index.positions, positions);
  return index;
}

template <class T>
void embedding_lookup(const ExecSpace& exec, const Tokens& tok, const Mat<T>& wte, int first,
                      const Mat<T>& y) {
  const std::int64_t rows = wte.extent(0);
  Kokkos::parallel_for(
      "cubelm::embedding_lookup", over(exec, y.extent(0), y.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t h) {
        const std::int64_t r = tok(n) - first;
        y(n, h) = (r >= 0 && r < rows) ? wte(r, h) : T(0);
      });
}

template <class T>
void position_add(const ExecSpace& exec, const Mat<T>& wpe, int seq_len, const Mat<T>& y) {
  Kokkos::parallel_for(
      "cubelm::position_add", over(exec, y.extent(0), y.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t h) {
        y(n, h) += wpe(n % seq_len, h);
      });
}

template <class T>
void embedding_forward(const ExecSpace& exec, const Tokens& tok, const Mat<T>& wte,
                       const Mat<T>& wpe, int seq_len, const Mat<T>& y) {
  embedding_lookup<T>(exec, tok, wte, 0, y);
  position_add<T>(exec, wpe, seq_len, y);
}

template <class T>
void token_backward(const ExecSpace& exec, const TokenIndex& index, const Mat<T>& dy,
                    const Mat<T>& dwte) {
  const auto offsets = index.offsets;
  const auto positions = index.positions;
  Kokkos::parallel_for(
      "cubelm::token_backward", over(exec, dwte.extent(0), dwte.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t v, const std::int64_t h) {
        T acc = 0;
        for (int i = offsets(v); i < offsets(v + 1); ++i)
          acc += dy(positions(i), h);
        dwte(v, h) += acc;
      });
}

template <class T>
void position_backward(const ExecSpace& exec, const Mat<T>& dy, int seq_len, const Mat<T>& dwpe) {
  const std::int64_t sequences = static_cast<std::int64_t>(dy.extent(0)) / seq_len;
  Kokkos::parallel_for(
      "cubelm::position_backward", over(exec, seq_len, dwpe.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t h) {
        T acc = 0;
        for (std::int64_t b = 0; b < sequences; ++b)
          acc += dy(b * seq_len + t, h);
        dwpe(t, h) += acc;
      });
}

template <class T>
void embedding_backward(const ExecSpace& exec, const TokenIndex& index, const Mat<T>& dy,
                        int seq_len, const Mat<T>& dwte, const Mat<T>& dwpe) {
  token_backward<T>(exec, index, dy, dwte);
  position_backward<T>(exec, dy, seq_len, dwpe);
}

template <class T>
void row_sum(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& s) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_sum", Range(exec, 0, x.extent(0)), KOKKOS_LAMBDA(const std::int64_t n) {
        T acc = 0;
        for (std::int64_t j = 0; j < h; ++j)
          acc += x(n, j);
        s(n) = acc;
      });
}

template <class T>
void row_centered_squares(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& s,
                          std::int64_t features, const Vec<T>& v) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_centered_squares", Range(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t n) {
        const T mu = s(n) / T(features);
        T acc = 0;
        for (std::int64_t j = 0; j < h; ++j) {
          const T d = x(n, j) - mu;
          acc += d * d;
        }
        v(n) = acc;
      });
}

template <class T>
void layernorm_normalize(const ExecSpace& exec, const Mat<T>& x, std::int64_t features,
                         const Vec<T>& gamma, const Vec<T>& beta, const Mat<T>& y,
                         const Vec<T>& mean, const Vec<T>& rstd) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::layernorm_normalize", Range(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t n) {
        const T mu = mean(n) / T(features);
        const T rs = T(1) / kmath::sqrt(rstd(n) / T(features) + T(kLayerNormEps));
        for (std::int64_t j = 0; j < h; ++j)
          y(n, j) = (x(n, j) - mu) * rs * gamma(j) + beta(j);
        mean(n) = mu;
        rstd(n) = rs;
      });
}

template <class T>
void layernorm_backward_sums(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                             const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                             const Mat<T>& sums) {
  const std::int64_t h = x.extent(1);
  Kokkos::parallel_for(
      "cubelm::layernorm_backward_sums", Range(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t n) {
        T sum_d = 0, sum_dx = 0;
        for (std::int64_t j = 0; j < h; ++j) {
          const T xhat = (x(n, j) - mean(n)) * rstd(n);
          const T d = dy(n, j) * gamma(j);
          sum_d += d;
          sum_dx += d * xhat;
        }
        sums(n, 0) = sum_d;
        sums(n, 1) = sum_dx;
      });
}

template <class T>
void layernorm_backward_input(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                              const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                              const Mat<T>& sums, std::int64_t features, const Mat<T>& dx) {
  Kokkos::parallel_for(
      "cubelm::layernorm_backward_input", over(exec, x.extent(0), x.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        // dxhat = dy * gamma; dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
        const T xhat = (x(n, j) - mean(n)) * rstd(n);
        dx(n, j) += rstd(n) * (dy(n, j) * gamma(j) - sums(n, 0) / T(features) -
                               xhat * (sums(n, 1) / T(features)));
      });
}

template <class T>
void layernorm_backward_params(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                               const Vec<T>& mean, const Vec<T>& rstd, const Vec<T>& dgamma,
                               const Vec<T>& dbeta) {
  const std::int64_t rows = x.extent(0);
  const std::int64_t h = x.extent(1);
  // Column sums in chunks of kColumnChunk columns: rows are read contiguously.
  Kokkos::parallel_for(
      "cubelm::layernorm_backward_params", Range(exec, 0, (h + kColumnChunk - 1) / kColumnChunk),
      KOKKOS_LAMBDA(const std::int64_t c) {
        const std::int64_t j0 = c * kColumnChunk;
        const std::int64_t width = h - j0 < kColumnChunk ? h - j0 : kColumnChunk;
        T g[kColumnChunk] = {}, b[kColumnChunk] = {};
        for (std::int64_t n = 0; n < rows; ++n)
          for (std::int64_t jj = 0; jj < width; ++jj) {
            const T d = dy(n, j0 + jj);
            g[jj] += d * (x(n, j0 + jj) - mean(n)) * rstd(n);
            b[jj] += d;
          }
        for (std::int64_t jj = 0; jj < width; ++jj) {
          dgamma(j0 + jj) += g[jj];
          dbeta(j0 + jj) += b[jj];
        }
      });
}

template <class T>
void layernorm_forward(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& gamma,
                       const Vec<T>& beta, const Mat<T>& y, const Vec<T>& mean,
                       const Vec<T>& rstd) {
  row_sum<T>(exec, x, mean);
  row_centered_squares<T>(exec, x, mean, x.extent(1), rstd);
  layernorm_normalize<T>(exec, x, x.extent(1), gamma, beta, y, mean, rstd);
}

template <class T>
void layernorm_backward(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                        const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                        const Mat<T>& dx, const Vec<T>& dgamma, const Vec<T>& dbeta) {
  const Mat<T> sums("cubelm::ln_sums", x.extent(0), 2);
  layernorm_backward_sums<T>(exec, dy, x, gamma, mean, rstd, sums);
  layernorm_backward_input<T>(exec, dy, x, gamma, mean, rstd, sums, x.extent(1), dx);
  layernorm_backward_params<T>(exec, dy, x, mean, rstd, dgamma, dbeta);
}

template <class T>
void bias_add(const ExecSpace& exec, const Mat<T>& y, const Vec<T>& b) {
  Kokkos::parallel_for(
      "cubelm::bias_add", over(exec, y.extent(0), y.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) { y(n, j) += b(j); });
}

template <class T>
void bias_backward(const ExecSpace& exec, const Mat<T>& dy, const Vec<T>& db) {
  const std::int64_t rows = dy.extent(0), cols = dy.extent(1);
  Kokkos::parallel_for(
      "cubelm::bias_backward", Range(exec, 0, (cols + kColumnChunk - 1) / kColumnChunk),
      KOKKOS_LAMBDA(const std::int64_t c) {
        const std::int64_t j0 = c * kColumnChunk;
        const std::int64_t width = cols - j0 < kColumnChunk ? cols - j0 : kColumnChunk;
        T acc[kColumnChunk] = {};
        for (std::int64_t n = 0; n < rows; ++n)
          for (std::int64_t jj = 0; jj < width; ++jj)
            acc[jj] += dy(n, j0 + jj);
        for (std::int64_t jj = 0; jj < width; ++jj)
          db(j0 + jj) += acc[jj];
      });
}

namespace {
// sqrt(2/pi) and the cubic coefficient of the tanh approximation of GELU.
constexpr double kGeluScale = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
} // namespace

template <class T>
void gelu_forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, const Mat<T>& th) {
  Kokkos::parallel_for(
      "cubelm::gelu_forward", over(exec, x.extent(0), x.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        const T v = x(n, j);
        const T t = kmath::tanh(T(kGeluScale) * (v + T(kGeluCubic) * v * v * v));
        th(n, j) = t;
        y(n, j) = T(0.5) * v * (T(1) + t);
      });
}

template <class T>
void gelu_backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& th, const Mat<T>& dy,
                   const Mat<T>& dx) {
  Kokkos::parallel_for(
      "cubelm::gelu_backward", over(exec, x.extent(0), x.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) {
        const T v = x(n, j);
        const T t = th(n, j);
        const T du = T(kGeluScale) * (T(1) + T(3 * kGeluCubic) * v * v);
        const T grad = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du;
        dx(n, j) = dy(n, j) * grad;
      });
}

template <class T>
void add_inplace(const ExecSpace& exec, const Mat<T>& y, const Mat<T>& x) {
  Kokkos::parallel_for(
      "cubelm::add_inplace", over(exec, y.extent(0), y.extent(1)),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t j) { y(n, j) += x(n, j); });
}

template <class T>
void row_max(const ExecSpace& exec, const Mat<T>& logits, const Vec<T>& mx) {
  const std::int64_t cols = logits.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_max", Range(exec, 0, logits.extent(0)), KOKKOS_LAMBDA(const std::int64_t n) {
        T m = logits(n, 0);
        for (std::int64_t v = 1; v < cols; ++v)
          m = logits(n, v) > m ? logits(n, v) : m;
        mx(n) = m;
      });
}

template <class T>
void row_sumexp_target(const ExecSpace& exec, const Mat<T>& logits, const Vec<T>& mx,
                       const Tokens& targets, int first, const Mat<T>& stats) {
  const std::int64_t cols = logits.extent(1);
  Kokkos::parallel_for(
      "cubelm::row_sumexp_target", Range(exec, 0, logits.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t n) {
        T sum = 0;
        for (std::int64_t v = 0; v < cols; ++v)
          sum += kmath::exp(logits(n, v) - mx(n));
        const std::int64_t t = targets(n) - first;
        stats(n, 0) = sum;
        stats(n, 1) = (t >= 0 && t < cols) ? logits(n, t) - mx(n) : T(0);
      });
}

template <class T>
void vocab_cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Vec<T>& mx,
                         const Mat<T>& stats, const Tokens& targets, int first,
                         const Vec<T>& losses, T grad_scale) {
  const std::int64_t cols = logits.extent(1);
  Kokkos::parallel_for(
      "cubelm::vocab_cross_entropy", Range(exec, 0, logits.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t n) {
        losses(n) = kmath::log(stats(n, 0)) - stats(n, 1);
        if (grad_scale != T(0)) {
          const T factor = grad_scale / stats(n, 0);
          for (std::int64_t v = 0; v < cols; ++v)
            logits(n, v) = factor * kmath::exp(logits(n, v) - mx(n));
          const std::int64_t t = targets(n) - first;
          if (t >= 0 && t < cols)
            logits(n, t) -= grad_scale;
        }
      });
}

template <class T>
void cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Tokens& targets,
                   const Vec<T>& losses, T grad_scale) {
  // The whole vocabulary is one slice of the vocabulary-parallel kernels.
  const std::int64_t rows = logits.extent(0);
  const Vec<T> mx(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::ce_max")),
                  rows);
  const Mat<T> stats(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::ce_stats")), rows, 2);
  row_max<T>(exec, logits, mx);
  row_sumexp_target<T>(exec, logits, mx, targets, 0, stats);
  vocab_cross_entropy<T>(exec, logits, mx, stats, targets, 0, losses, grad_scale);
}

#define CUBELM_INSTANTIATE_LAYERS(T)                                                               \
  template void embedding_lookup<T>(const ExecSpace&, const Tokens&, const Mat<T>&, int,           \
                                    const Mat<T>&);                                                \
  template void position_add<T>(const ExecSpace&, const Mat<T>&, int, const Mat<T>&);              \
  template void token_backward<T>(const ExecSpace&, const TokenIndex&, const Mat<T>&,              \
                                  const Mat<T>&);                                                  \
  template void position_backward<T>(const ExecSpace&, const Mat<T>&, int, const Mat<T>&);         \
  template void row_max<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&);                        \
  template void row_sumexp_target<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&,               \
                                     const Tokens&, int, const Mat<T>&);                           \
  template void vocab_cross_entropy<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&,             \
                                       const Mat<T>&, const Tokens&, int, const Vec<T>&, T);       \
  template void embedding_forward<T>(const ExecSpace&, const Tokens&, const Mat<T>&,               \
                                     const Mat<T>&, int, const Mat<T>&);                           \
  template void embedding_backward<T>(const ExecSpace&, const TokenIndex&, const Mat<T>&, int,     \
                                      const Mat<T>&, const Mat<T>&);                               \
  template void row_sum<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&);                        \
  template void row_centered_squares<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&,            \
                                        std::int64_t, const Vec<T>&);                              \
  template void layernorm_normalize<T>(const ExecSpace&, const Mat<T>&, std::int64_t,              \
                                       const Vec<T>&, const Vec<T>&, const Mat<T>&, const Vec<T>&, \
                                       const Vec<T>&);                                             \
  template void layernorm_backward_sums<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,         \
                                           const Vec<T>&, const Vec<T>&, const Vec<T>&,            \
                                           const Mat<T>&);                                         \
  template void layernorm_backward_input<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,        \
                                            const Vec<T>&, const Vec<T>&, const Vec<T>&,           \
                                            const Mat<T>&, std::int64_t, const Mat<T>&);           \
  template void layernorm_backward_params<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,       \
                                             const Vec<T>&, const Vec<T>&, const Vec<T>&,          \
                                             const Vec<T>&);                                       \
  template void layernorm_forward<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&,               \
                                     const Vec<T>&, const Mat<T>&, const Vec<T>&, const Vec<T>&);  \
  template void layernorm_backward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&,              \
                                      const Vec<T>&, const Vec<T>&, const Vec<T>&, const Mat<T>&,  \
                                      const Vec<T>&, const Vec<T>&);                               \
  template void bias_add<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&);                       \
  template void bias_backward<T>(const ExecSpace&, const Mat<T>&, const Vec<T>&);                  \
  template void gelu_forward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&, const Mat<T>&);    \
  template void gelu_backward<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&, const Mat<T>&,    \
                                 const Mat<T>&);                                                   \
  template void add_inplace<T>(const ExecSpace&, const Mat<T>&, const Mat<T>&);                    \
  template void cross_entropy<T>(const ExecSpace&, const Mat<T>&, const Tokens&, const Vec<T>&, T);

CUBELM_INSTANTIATE_LAYERS(float)
CUBELM_INSTANTIATE_LAYERS(double)

} // namespace cubelm::kernels
