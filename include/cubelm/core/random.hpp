#pragma once
/// \file
/// \brief splitmix64 (Steele, Lea & Flood), the one definition behind cubelm's
/// portable random numbers: the seeding of io::Rng and the counter-based
/// parameter initialisation (model/param.hpp). Definitions: docs/data.md.

#include <cstdint>

namespace cubelm {

/// \brief The increment of the splitmix64 state (the golden ratio in 64 bits).
inline constexpr std::uint64_t kSplitmix64Gamma = 0x9E3779B97F4A7C15ULL;

/// \brief splitmix64's output function, a bijective 64-bit hash:
/// z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
/// z ^= z >> 31.
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// \brief The next splitmix64 output: advances `state` by kSplitmix64Gamma and
/// returns splitmix64_mix of the new state.
constexpr std::uint64_t splitmix64_next(std::uint64_t& state) {
  state += kSplitmix64Gamma;
  return splitmix64_mix(state);
}

/// \brief The splitmix64 output that follows state `x`, without keeping a state:
/// splitmix64_mix(x + kSplitmix64Gamma). A stateless hash for counter-based
/// generators.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  return splitmix64_mix(x + kSplitmix64Gamma);
}

} // namespace cubelm
