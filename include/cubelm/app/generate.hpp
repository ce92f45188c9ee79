#pragma once
/// \file
/// \brief `cubelm generate`: text from a checkpoint of any layout, on one process with a
/// key/value cache, or under a deck's layout on its processes (docs/generate.md).

#include "cubelm/core/config.hpp"
#include "cubelm/core/environment.hpp"
#include "cubelm/model/sampling.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cubelm::app {

/// \brief The options of `cubelm generate`.
struct GenerateOptions {
  std::string checkpoint;            ///< the checkpoint file (.h5)
  std::optional<std::string> prompt; ///< --prompt TEXT
  std::string prompt_tokens;         ///< --prompt-tokens FILE (when no --prompt)
  std::string vocab;                 ///< --vocab FILE: a BPE vocabulary (io/bpe.hpp), or ""
  std::string merges;                ///< --merges FILE beside a vocab.json, or ""
  /// --logits FILE: the logits each generated token was drawn from, one row of
  /// model.vocab_size float32 (little-endian) per token; "" writes none
  std::string logits;
  /// --deck FILE: generate under this deck's layout, on the processes of the job
  /// (train::LayoutGenerator); "" on one process with a key/value cache (model::Generator)
  std::string deck;
  int tokens = 32; ///< tokens to generate
  model::SamplingOptions sampling{1.0, 0, 1.0, 1};
};

/// \brief How text becomes tokens and tokens become text: GPT-2's byte-level BPE from a
/// vocabulary file (--vocab, `cubelm data --bpe gpt2` wrote the training tokens with it);
/// without one the byte vocabulary (vocab_size 256, what `cubelm data` writes without
/// --bpe), and any other vocabulary is read and printed as ids.
struct Codec {
  std::string name; ///< "bpe", "bytes", "ids"
  /// the tokens of a prompt text; an Error naming the rule when the text cannot be encoded
  std::function<std::vector<std::int32_t>(const std::string& text)> encode;
  /// the text of one token
  std::function<std::string(std::int32_t token)> decode;
  std::string separator; ///< printed between decoded tokens
};

/// \brief The Codec of a model: the BPE of `vocab` (and `merges`) when given, whose ids
/// must fit the model's vocabulary (an Error naming both sizes otherwise); else bytes for
/// vocab_size 256, else ids.
Codec codec_for(const ModelConfig& model, const std::string& vocab = "",
                const std::string& merges = "");

/// \brief `cubelm generate CKPT ...`: prints the generated tokens as they come (stdout,
/// flushed after each) and a closing line with the count and tokens/s (stderr), from rank
/// 0. Without --deck, one process only. Returns the exit code; user errors (options,
/// prompt, checkpoint, deck) throw.
int run_generate(const GenerateOptions& options, const Environment& env);

} // namespace cubelm::app
