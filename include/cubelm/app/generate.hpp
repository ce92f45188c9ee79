#pragma once
/// \file
/// \brief `cubelm generate`: text from a checkpoint of any layout, on one process, with a
/// key/value cache (docs/generate.md).

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
  int tokens = 32;                   ///< tokens to generate
  model::SamplingOptions sampling{1.0, 0, 1.0, 1};
};

/// \brief How text becomes tokens and tokens become text. The byte vocabulary
/// (vocab_size 256, what `cubelm data` writes) has one; every other vocabulary is read
/// and printed as ids until a tokenizer is given (a third Codec, from a vocabulary
/// file, is where one plugs in).
struct Codec {
  std::string name; ///< "bytes", "ids"
  /// the tokens of a prompt text; an Error naming the rule when the text cannot be encoded
  std::function<std::vector<std::int32_t>(const std::string& text)> encode;
  /// the text of one token
  std::function<std::string(std::int32_t token)> decode;
  std::string separator; ///< printed between decoded tokens
};

/// \brief The Codec of a model: bytes for vocab_size 256, else ids.
Codec codec_for(const ModelConfig& model);

/// \brief `cubelm generate CKPT ...`: prints the generated tokens as they come (stdout,
/// flushed after each) and a closing line with the count and tokens/s (stderr). One
/// process only. Returns the exit code; user errors (options, prompt, checkpoint) throw.
int run_generate(const GenerateOptions& options, const Environment& env);

} // namespace cubelm::app
