#pragma once
/// \file
/// \brief Rng, the portable xoshiro256** generator behind the shuffle sampler
/// and the synthetic corpus. Definitions and seeding: docs/data.md.

#include "cubelm/core/random.hpp"

#include <cstdint>

namespace cubelm::io {

/// \brief splitmix64_mix (core/random.hpp): a bijective 64-bit hash.
using cubelm::splitmix64_mix;

/// \brief Portable xoshiro256** generator, seeded from splitmix64 as
/// docs/data.md says.
class Rng {
public:
  /// \brief Independent streams for one seed: epochs, the synthetic corpus.
  explicit Rng(std::uint64_t seed, std::uint64_t stream = 0);
  /// \brief Seeds the four state words directly (for reference tests).
  Rng(std::uint64_t s0, std::uint64_t s1, std::uint64_t s2, std::uint64_t s3);
  /// \brief The next 64 random bits.
  std::uint64_t next();
  /// \brief Uniform integer in [0, n), n >= 1: draws r = next() until
  /// r >= 2^64 mod n, then returns r mod n.
  std::uint64_t below(std::uint64_t n);

private:
  std::uint64_t s_[4];
};

} // namespace cubelm::io
