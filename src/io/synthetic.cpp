#include "cubelm/io/synthetic.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/io/rng.hpp"

#include <cmath>
#include <string>
#include <utility>

namespace cubelm::io {

namespace {

void check_synthetic(int vocab, int branching) {
  if (vocab < 1)
    throw Error("synthetic corpus: vocab = " + std::to_string(vocab) + " must be at least 1");
  if (branching < 1 || branching > vocab)
    throw Error("synthetic corpus: branching = " + std::to_string(branching) +
                " must be in [1, vocab = " + std::to_string(vocab) + "]");
}

// Step 1 of the generator (docs/data.md): the successor table, drawn from `rng`.
std::vector<std::int32_t> successors(int vocab, int branching, Rng& rng) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(vocab));
  for (int a = 0; a < vocab; ++a)
    p[a] = a;
  std::vector<std::int32_t> succ(static_cast<std::size_t>(vocab) * branching);
  for (int a = 0; a < vocab; ++a)
    for (int i = 0; i < branching; ++i) {
      std::swap(p[i], p[i + rng.below(static_cast<std::uint64_t>(vocab - i))]);
      succ[static_cast<std::size_t>(a) * branching + i] = p[i];
    }
  return succ;
}

} // namespace

std::vector<std::int32_t> synthetic_successors(int vocab, int branching, std::uint64_t seed) {
  check_synthetic(vocab, branching);
  Rng rng(seed, kSyntheticStream);
  return successors(vocab, branching, rng);
}

std::vector<std::int32_t> make_synthetic_corpus(int vocab, std::int64_t count, int branching,
                                                std::uint64_t seed) {
  check_synthetic(vocab, branching);
  if (count < 0)
    throw Error("synthetic corpus: count = " + std::to_string(count) + " must be at least 0");
  Rng rng(seed, kSyntheticStream);
  const std::vector<std::int32_t> succ = successors(vocab, branching, rng);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
  if (count == 0)
    return tokens;
  tokens[0] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  for (std::int64_t i = 1; i < count; ++i)
    tokens[i] = succ[static_cast<std::size_t>(tokens[i - 1]) * branching +
                     rng.below(static_cast<std::uint64_t>(branching))];
  return tokens;
}

double synthetic_entropy_floor(int branching) {
  if (branching < 1)
    throw Error("synthetic corpus: branching = " + std::to_string(branching) +
                " must be at least 1");
  return std::log(static_cast<double>(branching));
}

} // namespace cubelm::io
