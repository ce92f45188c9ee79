#pragma once
/// \file
/// \brief The choice of the next token from a row of logits: greedy, or sampled with a
/// temperature, top-k and top-p (nucleus) filtering, from cubelm's splitmix64
/// (core/random.hpp). Host arithmetic on a host copy of the logits (docs/generate.md).

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::model {

/// \brief How the next token is chosen.
struct SamplingOptions {
  /// 0: greedy (the largest logit, the lowest id among equal ones); > 0: sample from
  /// softmax(logits / temperature)
  double temperature = 1.0;
  int top_k = 0;      ///< keep the top_k most probable tokens (0: all)
  double top_p = 1.0; ///< then the fewest most probable tokens whose probability reaches top_p
  std::uint64_t seed = 0;
};

/// \brief "" when the options are valid; else the message naming the first bad option,
/// its value and the rule: temperature >= 0, top_k >= 0, 0 < top_p <= 1.
std::string check_sampling(const SamplingOptions& options);

/// \brief Chooses tokens one after another; deterministic for given options and logits.
///
/// Sampling: the tokens ordered by logit, largest first (equal logits: lower id first);
/// the first top_k of them kept; their probabilities p = softmax(logit / temperature)
/// over the kept ones; then the shortest prefix of that order whose probabilities sum to
/// at least top_p kept (never empty), renormalised; one uniform u in [0, 1) per token
/// (the top 53 bits of the next splitmix64 output of a state that starts at `seed`)
/// picks the first token whose cumulative probability exceeds u. Sums in double.
/// top_k = 1 and temperature 0 both give the greedy token (temperature 0 draws nothing).
class TokenSampler {
public:
  explicit TokenSampler(const SamplingOptions& options);
  /// \brief The next token from logits[0 .. vocab). A NaN logit is an Error.
  std::int32_t next(const float* logits, std::int64_t vocab);
  /// \brief The greedy token: the largest logit, the lowest id among equal ones.
  static std::int32_t argmax(const float* logits, std::int64_t vocab);

private:
  SamplingOptions options_;
  std::uint64_t state_;
  std::vector<std::int32_t> order_; // candidate ids, reused
  std::vector<double> weight_;      // their unnormalised probabilities
};

} // namespace cubelm::model
