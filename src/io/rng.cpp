#include "cubelm/io/rng.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/core/random.hpp"

namespace cubelm::io {

namespace {

std::uint64_t rotl(std::uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

} // namespace

Rng::Rng(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t x = seed ^ splitmix64_mix(stream);
  for (auto& s : s_)
    s = splitmix64_next(x);
}

Rng::Rng(std::uint64_t s0, std::uint64_t s1, std::uint64_t s2, std::uint64_t s3)
    : s_{s0, s1, s2, s3} {}

std::uint64_t Rng::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

std::uint64_t Rng::below(std::uint64_t n) {
  CUBELM_ASSERT(n >= 1, "Rng::below needs n >= 1");
  // 2^64 mod n: rejecting draws under it leaves a multiple of n equally likely values.
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = next();
    if (r >= threshold)
      return r % n;
  }
}

} // namespace cubelm::io
