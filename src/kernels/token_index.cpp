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
  TokenIndexer indexer;
  const TokenIndex index = indexer.build(ExecSpace(), tokens, first, count);
  ExecSpace().fence();
  return index;
}

const TokenIndex& TokenIndexer::build(const ExecSpace& exec,
                                      const std::vector<std::int32_t>& tokens, int first,
                                      int count) {
  // Buffers for `count` tokens of the slice and (at most) every token: kept between builds.
  if (index_.offsets.extent_int(0) != count + 1) {
    index_.offsets = Kokkos::View<int*, MemSpace>("cubelm::token_offsets", count + 1);
    offsets_ = Kokkos::create_mirror_view(index_.offsets);
    next_.assign(static_cast<std::size_t>(count), 0);
  }
  if (index_.positions.extent(0) < tokens.size()) {
    index_.positions = Kokkos::View<int*, MemSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::token_positions")),
        tokens.size());
    positions_ = Kokkos::create_mirror_view(index_.positions);
  }
  // The previous copy to the device may still read the host buffers.
  exec.fence();
  for (int v = 0; v <= count; ++v)
    offsets_(v) = 0;
  for (const std::int32_t t : tokens)
    if (t >= first && t < first + count)
      offsets_(t - first + 1) += 1;
  for (int v = 0; v < count; ++v)
    offsets_(v + 1) += offsets_(v);
  for (int v = 0; v < count; ++v)
    next_[static_cast<std::size_t>(v)] = offsets_(v);
  for (std::size_t n = 0; n < tokens.size(); ++n)
    if (tokens[n] >= first && tokens[n] < first + count)
      positions_(next_[static_cast<std::size_t>(tokens[n] - first)]++) = static_cast<int>(n);
  Kokkos::deep_copy(exec, index_.offsets, offsets_);
  Kokkos::deep_copy(exec, index_.positions, positions_);
  return index_;
}

} // namespace cubelm::kernels
