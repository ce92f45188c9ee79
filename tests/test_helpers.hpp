#pragma once
// Small helpers shared by the model tests.

#include "cubelm/io/deck.hpp"

#include <cstdint>
#include <random>
#include <vector>

namespace cubelm::testing {

/// A model shape for tests: `vocab` tokens, context 4, 2 layers.
inline io::ModelConfig tiny_model(int vocab, int hidden, int heads) {
  io::ModelConfig c;
  c.vocab_size = vocab;
  c.seq_len = 4;
  c.hidden = hidden;
  c.heads = heads;
  c.layers = 2;
  return c;
}

/// `n` token ids below `vocab` from a seeded generator.
inline std::vector<std::int32_t> random_tokens(int n, int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t)
    x = static_cast<std::int32_t>(gen() % vocab);
  return t;
}

} // namespace cubelm::testing
