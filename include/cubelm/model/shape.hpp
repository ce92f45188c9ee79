#pragma once
/// \file
/// \brief Closed-form sizes of the GPT model of DESIGN §4 (no allocation).

#include "cubelm/comm/layout.hpp"
#include "cubelm/io/deck.hpp"

#include <algorithm>
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

/// \brief Bytes one rank holds, by kind.
struct Memory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer = 0;   ///< AdamW moments m and v
  std::int64_t activations = 0; ///< saved activations and backward buffers of one micro-batch
  std::int64_t total() const { return parameters + gradients + optimizer + activations; }
};

/// \brief Parameter elements on one rank of the tensor-parallel group (`tp` ranks in
/// `mode`; DESIGN §3 and docs/tensor-parallel.md for the layouts):
///  - none/1d (p = tp): V H / p + T H + L (12 H^2 / p + 7 H / p + 6 H) + 2 H: vocabulary rows
///    and weights split p ways; LayerNorms, wpe and the row-parallel biases replicated;
///  - 2d (q^2 = tp): (V H + 12 L H^2 + 13 L H + 2 H) / q^2 + T H / q: every weight and vector
///    in q^2 blocks; wpe holds a hidden block, replicated over the column;
///  - 3d (q^3 = tp): (V H + 12 L H^2) / q^3 + (13 L + 2) H / q + T H / q: the weights fall as
///    1/q^3; vectors and wpe hold a feature chunk, replicated over a plane.
inline std::int64_t parameters_per_rank(const io::ModelConfig& m, comm::TensorMode mode, int tp) {
  const std::int64_t h = m.hidden, v = m.vocab_size, t = m.seq_len, l = m.layers;
  const std::int64_t matrices = v * h + 12 * l * h * h;
  switch (mode) {
  case comm::TensorMode::d2: {
    const std::int64_t q = comm::Layout{1, 1, tp, mode}.side();
    return (matrices + 13 * l * h + 2 * h) / (q * q) + t * h / q;
  }
  case comm::TensorMode::d3: {
    const std::int64_t q = comm::Layout{1, 1, tp, mode}.side();
    return matrices / (q * q * q) + (13 * l + 2) * h / q + t * h / q;
  }
  case comm::TensorMode::none:
  case comm::TensorMode::d1:
    break;
  }
  const std::int64_t p = tp;
  return v * h / p + t * h + l * (12 * h * h / p + 7 * h / p + 6 * h) + 2 * h;
}

/// \brief Activation elements on one rank for micro-batches of `micro` sequences: the
/// model's saved activations and backward buffers, and the mode's own buffers (LayerNorm
/// statistics, logits and cross-entropy rows, gathered blocks, scratch shared by all
/// layers). N = micro T tokens; each rank holds n = N / tp_rows of them (1d: n = N, 2d:
/// N / q, 3d: N / q^2), ho / hi the local columns of the residual stream and of the inside
/// of a pair, s = (micro / tp_rows) (heads / split) T^2 attention scores. The model:
/// L (2 n ho + 16 n hi + s) + (2L + 4) n ho + 16 n hi + s. The mode: docs/tensor-parallel.md.
inline std::int64_t activations_per_rank(const io::ModelConfig& m, comm::TensorMode mode, int tp,
                                         int micro) {
  const std::int64_t h = m.hidden, v = m.vocab_size, t = m.seq_len, l = m.layers;
  const std::int64_t big_n = static_cast<std::int64_t>(micro) * t;
  std::int64_t n = big_n, ho = h, hi = h, heads = m.heads, seqs = micro, extra = 0;
  switch (mode) {
  case comm::TensorMode::d2: {
    const std::int64_t q = comm::Layout{1, 1, tp, mode}.side();
    const std::int64_t split = q > 1 ? 1 : 0; // vectors: gathered block, partial, piece
    n = big_n / q, ho = h / q, hi = h / q, heads = m.heads / q, seqs = micro / q;
    extra = (2 * l + 1) * (4 * n + split * 2 * (2 * h / q + h / (q * q))) +
            l * split * (2 * 9 * h / q + 9 * h / (q * q)) + big_n + n * v / q + 5 * n +
            std::max(n * 4 * h / q, n * v / q) +                  // broadcast activation
            std::max(4 * h * h / (q * q), v * h / (q * q)) +      // broadcast weight
            std::max({n * 4 * h / q, big_n * h / q, n * v / q}) + // partial products
            2 * std::max(4 * h * h / (q * q), v * h / (q * q));   // weight partial, sum
    break;
  }
  case comm::TensorMode::d3: {
    const std::int64_t q = comm::Layout{1, 1, tp, mode}.side();
    const std::int64_t sum = q > 1 ? 1 : 0; // replicated vectors: a partial gradient
    n = big_n / (q * q), ho = h / q, hi = h / q, heads = m.heads / q, seqs = micro / (q * q);
    extra = (2 * l + 1) * (4 * n + sum * 2 * h / q) + l * sum * 9 * h / q + sum * t * h / q +
            n * q + 2 * (v / q) * (h / q) + n * v / q + 5 * n + 4 * n * h + // gathered input
            4 * h * h / (q * q) +                                           // gathered weight
            n * std::max(4 * h, v) +                                        // gathered output
            4 * n * h +                                             // input-gradient partial
            4 * h * h / (q * q) +                                   // weight-gradient partial
            std::max(4 * h * h / (q * q * q), v * h / (q * q * q)); // its reduced block
    break;
  }
  case comm::TensorMode::none:
  case comm::TensorMode::d1:
    hi = h / tp, heads = m.heads / tp;
    extra = (2 * l + 1) * 4 * n + 6 * n + n * v / tp;
    break;
  }
  const std::int64_t scores = seqs * heads * t * t;
  return l * (2 * n * ho + 16 * n * hi + scores) + (2 * l + 4) * n * ho + 16 * n * hi + scores +
         extra;
}

/// \brief Memory per rank of a deck's layout (float32).
inline Memory estimate_memory(const io::Deck& deck) {
  const comm::TensorMode mode = deck.parallel.tensor_mode;
  const int tp = deck.parallel.tensor_size;
  Memory mem;
  mem.parameters = 4 * parameters_per_rank(deck.model, mode, tp);
  mem.gradients = mem.parameters;
  mem.optimizer = 2 * mem.parameters;
  mem.activations = 4 * activations_per_rank(deck.model, mode, tp, deck.micro_batch());
  return mem;
}

} // namespace cubelm::model
