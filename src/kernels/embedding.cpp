#include "cubelm/kernels/embedding.hpp"

#include "ranges.hpp"

namespace cubelm::kernels {

template <class T>
void embedding_lookup(const ExecSpace& exec, const Tokens& tok, const Mat<T>& wte, int first,
                      const Mat<T>& y) {
  const std::int64_t rows = wte.extent(0);
  for_each_element(
      "cubelm::embedding_lookup", exec, y.extent(0), y.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t h) {
        const std::int64_t r = tok(n) - first;
        y(n, h) = (r >= 0 && r < rows) ? wte(r, h) : T(compute_t<T>(0));
      });
}

template <class T>
void position_add(const ExecSpace& exec, const Mat<T>& wpe, Positions pos, const Mat<T>& y,
                  std::int64_t first_row) {
  using C = compute_t<T>;
  const std::int64_t local = pos.local;
  for_each_element(
      "cubelm::position_add", exec, y.extent(0), y.extent(1),
      KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t h) {
        y(n, h) = C(y(n, h)) + C(wpe(pos.global(static_cast<int>((first_row + n) % local)), h));
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
                    const Mat<compute_t<T>>& dwte) {
  using C = compute_t<T>;
  const auto offsets = index.offsets;
  const auto positions = index.positions;
  // Every element sums its token's rows of dy in row order, from 0, then adds the sum to
  // dwte: the same order, and so the same bits, on CPUs and GPUs.
  if constexpr (kOnHost) {
    // A vocabulary row at a time, its columns in chunks of kColumnChunk whose sums stay
    // in registers: the loops over a chunk vectorise, where for_each_element's loop over
    // the columns, with the loop over the tokens inside, does not (most rows have no
    // token, so the work is mostly adding 0 to dwte).
    const std::int64_t cols = dwte.extent(1);
    Kokkos::parallel_for(
        "cubelm::token_backward", Range(exec, 0, dwte.extent(0)),
        KOKKOS_LAMBDA(const std::int64_t v) {
          const int begin = offsets(v), end = offsets(v + 1);
          auto chunk = [&](const std::int64_t j0, const std::int64_t width) {
            C acc[kColumnChunk] = {};
            for (int i = begin; i < end; ++i) {
              const std::int64_t p = positions(i);
              for (std::int64_t jj = 0; jj < width; ++jj)
                acc[jj] += C(dy(p, j0 + jj));
            }
            for (std::int64_t jj = 0; jj < width; ++jj)
              dwte(v, j0 + jj) += acc[jj];
          };
          std::int64_t j0 = 0;
          for (; j0 + kColumnChunk <= cols; j0 += kColumnChunk)
            chunk(j0, kColumnChunk); // a constant trip count: unrolled and vectorised
          if (j0 < cols)
            chunk(j0, cols - j0);
        });
  } else {
    for_each_element(
        "cubelm::token_backward", exec, dwte.extent(0), dwte.extent(1),
        KOKKOS_LAMBDA(const std::int64_t v, const std::int64_t h) {
          C acc = 0;
          for (int i = offsets(v); i < offsets(v + 1); ++i)
            acc += C(dy(positions(i), h));
          dwte(v, h) += acc;
        });
  }
}

template <class T>
void position_backward(const ExecSpace& exec, const Mat<T>& dy, Positions pos,
                       const Mat<compute_t<T>>& dwpe) {
  using C = compute_t<T>;
  const std::int64_t local = pos.local;
  const std::int64_t sequences = static_cast<std::int64_t>(dy.extent(0)) / local;
  // pos.global is one-to-one: each thread owns its row of dwpe.
  for_each_element(
      "cubelm::position_backward", exec, local, dwpe.extent(1),
      KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t h) {
        C acc = 0;
        for (std::int64_t b = 0; b < sequences; ++b)
          acc += C(dy(b * local + t, h));
        dwpe(pos.global(static_cast<int>(t)), h) += acc;
      });
}

template <class T>
void embedding_backward(const ExecSpace& exec, const TokenIndex& index, const Mat<T>& dy,
                        int seq_len, const Mat<compute_t<T>>& dwte, const Mat<compute_t<T>>& dwpe) {
  token_backward<T>(exec, index, dy, dwte);
  position_backward<T>(exec, dy, seq_len, dwpe);
}

#define CUBELM_INSTANTIATE_EMBEDDING(T)                                                            \
  template void embedding_lookup<T>(const ExecSpace&, const Tokens&, const Mat<T>&, int,           \
                                    const Mat<T>&);                                                \
  template void position_add<T>(const ExecSpace&, const Mat<T>&, Positions, const Mat<T>&,         \
                                std::int64_t);                                                     \
  template void token_backward<T>(const ExecSpace&, const TokenIndex&, const Mat<T>&,              \
                                  const Mat<compute_t<T>>&);                                       \
  template void position_backward<T>(const ExecSpace&, const Mat<T>&, Positions,                   \
                                     const Mat<compute_t<T>>&);                                    \
  template void embedding_forward<T>(const ExecSpace&, const Tokens&, const Mat<T>&,               \
                                     const Mat<T>&, int, const Mat<T>&);                           \
  template void embedding_backward<T>(const ExecSpace&, const TokenIndex&, const Mat<T>&, int,     \
                                      const Mat<compute_t<T>>&, const Mat<compute_t<T>>&);

CUBELM_INSTANTIATE_EMBEDDING(float)
CUBELM_INSTANTIATE_EMBEDDING(double)
CUBELM_INSTANTIATE_EMBEDDING(bf16)

} // namespace cubelm::kernels
