#pragma once
/// \file
/// \brief Closed-form sizes of the GPT model of DESIGN §4 (no allocation).

#include "cubelm/io/deck.hpp"

#include <cstdint>
#include <optional>

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

/// \brief Bytes one rank holds, by kind.
struct Memory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer = 0;   ///< AdamW moments m and v
  std::int64_t activations = 0; ///< saved activations and backward buffers of one micro-batch
  std::int64_t total() const { return parameters + gradients + optimizer + activations; }
};

/// \brief Parameter elements on one rank of p-way 1D tensor parallelism (p = 1: one
/// process): V H / p + T H + L (12 H^2 / p + 7 H / p + 6 H) + 2 H. Vocabulary rows and
/// the weights split p ways, LayerNorms, wpe and the row-parallel biases replicated.
inline std::int64_t parameters_per_rank_1d(const io::ModelConfig& m, int p) {
  const std::int64_t h = m.hidden;
  return static_cast<std::int64_t>(m.vocab_size) * h / p +
         static_cast<std::int64_t>(m.seq_len) * h +
         m.layers * (12 * h * h / p + 7 * h / p + 6 * h) + 2 * h;
}

/// \brief Activation elements of the model's forward and backward buffers on one rank of
/// p-way 1D tensor parallelism, for micro-batches of `micro` sequences (N = micro T tokens):
/// per layer 2 N H + 16 N H / p + micro (a/p) T^2, plus (2L + 4) N H + 16 N H / p +
/// micro (a/p) T^2 for the residual stream, the backward buffers and attention's workspace.
inline std::int64_t activations_per_rank_1d(const io::ModelConfig& m, int p, int micro) {
  const std::int64_t h = m.hidden, t = m.seq_len, n = static_cast<std::int64_t>(micro) * t;
  const std::int64_t scores = static_cast<std::int64_t>(micro) * (m.heads / p) * t * t;
  return m.layers * (2 * n * h + 16 * n * h / p + scores) + (2 * m.layers + 4) * n * h +
         16 * n * h / p + scores;
}

/// \brief Memory per rank of a deck's layout (float32), or nothing for modes without an
/// estimate.
inline std::optional<Memory> estimate_memory(const io::Deck& deck) {
  const comm::TensorMode mode = deck.parallel.tensor_mode;
  if (mode != comm::TensorMode::none && mode != comm::TensorMode::d1)
    return std::nullopt;
  const int p = deck.parallel.tensor_size;
  Memory mem;
  mem.parameters = 4 * parameters_per_rank_1d(deck.model, p);
  mem.gradients = mem.parameters;
  mem.optimizer = 2 * mem.parameters;
  mem.activations = 4 * activations_per_rank_1d(deck.model, p, deck.micro_batch());
  return mem;
}

} // namespace cubelm::model
