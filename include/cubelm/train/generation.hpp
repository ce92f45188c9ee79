#pragma once
/// \file
/// \brief Text generation under a deck's layout (`mpiexec -n N cubelm generate CKPT --deck
/// D`): the model spread over the ranks as the deck trains it, its weights read from a
/// checkpoint of any layout, for models that one device cannot hold (docs/generate.md).
///
/// Each feed runs the whole context through the layout (the forward of a validation
/// batch) and gathers the logits of its last token: no key/value cache, so a new token
/// costs a forward of model.seq_len positions. model::Generator, on one process, keeps a
/// cache.

#include "cubelm/comm/communicator.hpp"
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/kernels/views.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/pipeline/schedule.hpp"
#include "cubelm/train/pipeline.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cubelm::train {

/// \brief The deck's layout and a checkpoint's weights, for generation.
class LayoutGenerator {
public:
  /// \brief Collective over `comm`, whose size must fit the deck's layout. The deck's model
  /// must be the checkpoint's (a collective cubelm::Error naming the keys that differ);
  /// MoE layers route dropless, as model::Generator does, whatever capacity_factor says.
  /// Runs in fp32 whatever train.precision says (checkpoints hold fp32 weights).
  LayoutGenerator(const Deck& deck, const std::string& checkpoint,
                  const comm::Communicator& comm = comm::Communicator::world());
  ~LayoutGenerator();
  LayoutGenerator(const LayoutGenerator&) = delete;
  LayoutGenerator& operator=(const LayoutGenerator&) = delete;

  const ModelConfig& config() const { return deck_.model; }
  /// \brief Tokens in the context: those fed since construction.
  int position() const { return static_cast<int>(context_.size()); }
  /// \brief Collective: appends `tokens` to the context and returns the logits of its last
  /// token over the real vocabulary (host memory, config().vocab_size floats, valid until
  /// the next call), the same on every rank. A token outside [0, vocab_size) or a context
  /// longer than model.seq_len is a collective cubelm::Error; an empty `tokens` an
  /// InternalError.
  const std::vector<float>& feed(const std::vector<std::int32_t>& tokens);
  /// \brief The sequences of each forward (the deck's micro-batch), every one the context.
  int sequences() const { return batch_; }

private:
  Deck deck_;
  comm::Watchdog watchdog_;
  pipeline::PipelinePlan plan_;
  PipelineStage stage_; // holds a reference to plan_
  int batch_;
  std::unique_ptr<model::GridModel<real>> net_;
  std::vector<std::int32_t> context_;
  kernels::Vec<float> out_;
  std::vector<float> logits_;
};

} // namespace cubelm::train
