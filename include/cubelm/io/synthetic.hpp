#pragma once
/// \file
/// \brief A synthetic corpus with a known entropy floor: a Markov chain in
/// which every token has the same number of equally likely successors. The
/// generator: docs/data.md.

#include <cstdint>
#include <vector>

namespace cubelm::io {

/// \brief The Rng stream of the synthetic corpus; far from any epoch number,
/// so that one seed can drive both the corpus and the shuffle sampler.
inline constexpr std::uint64_t kSyntheticStream = ~std::uint64_t{0};

/// \brief succ[a][i] of the synthetic chain, row-major [vocab][branching].
std::vector<std::int32_t> synthetic_successors(int vocab, int branching, std::uint64_t seed);
/// \brief `count` tokens of the synthetic Markov chain (docs/data.md).
std::vector<std::int32_t> make_synthetic_corpus(int vocab, std::int64_t count, int branching,
                                                std::uint64_t seed);
/// \brief ln(branching): the least mean cross-entropy, in nats per token, that
/// any model can reach on the synthetic corpus.
double synthetic_entropy_floor(int branching);

} // namespace cubelm::io
