#pragma once
/// \file
/// \brief GPT-2 for text generation on one device: the weights of a checkpoint of any
/// layout, whole, and a key/value cache, so that each new token costs one position
/// (docs/generate.md).
///
/// The same model as ShardedGPT (docs/model.md), written for inference: no tensor
/// parallelism, no activations kept for a backward pass. Each position's keys and values
/// stay in a cache per layer; feeding tokens runs them through the model at the next
/// positions, over the cached ones. MoE layers route every token to its top_k experts,
/// dropless.

#include "cubelm/core/config.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/kernels/moe.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::model {

/// \brief The model a checkpoint holds: the [model] of the deck text stored in its root
/// attribute "deck". A collective cubelm::Error naming the file when the attribute is
/// missing or the deck cannot be read.
ModelConfig checkpoint_model(const io::CheckpointReader& reader);

/// \brief The weights of a checkpoint and a key/value cache, on this process's device.
class Generator {
public:
  /// \brief Reads every tensor of /model of `reader` (collective over the reader's
  /// communicator) for the model `config`, and makes room for config.seq_len cached
  /// positions. A prompt is run at most `rows` positions at a time. A tensor of another
  /// shape, a missing or damaged one, is the reader's cubelm::Error.
  Generator(const io::CheckpointReader& reader, const ModelConfig& config, int rows = 64);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  const ModelConfig& config() const { return config_; }
  /// \brief Positions in the cache: the tokens fed since construction or reset().
  int position() const { return position_; }
  /// \brief Empties the cache: the next token goes to position 0.
  void reset() { position_ = 0; }

  /// \brief Runs `tokens` through the model at positions position() .. position() + n - 1,
  /// adding their keys and values to the cache, and returns the logits of the last of
  /// them over the real vocabulary (host memory, config().vocab_size floats, valid until
  /// the next call). A token outside [0, vocab_size) or more positions than
  /// model.seq_len is a cubelm::Error; an empty `tokens` is an InternalError.
  const std::vector<float>& feed(const std::vector<std::int32_t>& tokens);
  /// \brief As feed(), returning every token's logits: n rows of vocab_size, row-major.
  std::vector<float> feed_all(const std::vector<std::int32_t>& tokens);

  /// \brief Device bytes of the weights, the cache and the buffers.
  std::int64_t bytes() const;

private:
  struct Layer;
  // Runs tokens[begin, end) (at most rows_) at position_; copies the logits of every row
  // (all) or of the last into logits_host_.
  void run(const std::vector<std::int32_t>& tokens, std::size_t begin, std::size_t end, bool all);
  void moe(const Layer& layer, std::int64_t n);

  ModelConfig config_;
  int rows_;
  int position_ = 0;
  kernels::Mat<float> wte_, wpe_;
  kernels::Vec<float> lnf_gamma_, lnf_beta_;
  std::vector<Layer> layers_;
  // Buffers of up to rows_ positions; scores [rows_ x heads, seq_len]; logits [rows_, V].
  kernels::Mat<float> x_, y_, q_, att_, h_, g_, th_, scores_, logits_;
  kernels::Vec<float> mean_, rstd_;
  kernels::Tokens tokens_;
  kernels::Tokens::host_mirror_type tokens_host_;
  // MoE layers: router probabilities [rows_, E], choices and gates [rows_, k], the slot of
  // pair (t, j), t k + j, and the experts' outputs [rows_ k, H] and their gated sum.
  kernels::Mat<float> probs_, gate_, expert_out_, moe_out_;
  kernels::IntMat choice_, slot_;
  kernels::IntMat::host_mirror_type choice_host_;
  std::vector<float> logits_host_;
};

} // namespace cubelm::model
