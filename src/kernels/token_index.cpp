// The host half of the embedding backward: a stable counting sort of the tokens
// into the TokenIndex that token_backward reads. Plain host code (no kernel, no
// scalar template), so it sits apart from the device kernels of embedding.cpp.

#include "cubelm/kernels/embedding.hpp"

#include "cubelm/core/error.hpp"

#include <string>
#include <vector>

namespace cubelm::kernels {

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

} // namespace cubelm::kernels
