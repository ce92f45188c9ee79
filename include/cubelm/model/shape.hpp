#pragma once
/// \file
/// \brief Closed-form sizes of the GPT model of DESIGN §4 (no allocation).

#include "cubelm/io/deck.hpp"

#include <cstdint>

namespace cubelm::model {

/// \brief Parameters per transformer block: ln1, ln2 (2H each), wq/wk/wv/wo (H^2 + H each),
/// w1 (4H^2) + b1 (4H), w2 (4H^2) + b2 (H): 12 H^2 + 13 H.
inline std::int64_t parameters_per_layer(const io::ModelConfig& m) {
  const std::int64_t h = m.hidden;
  return 12 * h * h + 13 * h;
}

/// \brief All parameters: wte [V,H] (tied with the head), wpe [T,H], the blocks, ln_f.
inline std::int64_t parameter_count(const io::ModelConfig& m) {
  const std::int64_t h = m.hidden;
  return static_cast<std::int64_t>(m.vocab_size) * h + static_cast<std::int64_t>(m.seq_len) * h +
         m.layers * parameters_per_layer(m) + 2 * h;
}

/// \brief Model FLOPs per token for forward + backward: 6 N + 12 L H T
/// (6 per parameter, plus the q k^T and attention-times-v products of every layer).
inline double flops_per_token(const io::ModelConfig& m) {
  return 6.0 * static_cast<double>(parameter_count(m)) +
         12.0 * m.layers * static_cast<double>(m.hidden) * m.seq_len;
}

} // namespace cubelm::model
