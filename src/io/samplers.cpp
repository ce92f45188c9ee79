#include "cubelm/io/sampler.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/io/rng.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

namespace cubelm::io {

Sampler::Sampler(std::int64_t n, int batch, int context) : n_(n), batch_(batch), context_(context) {
  if (batch < 1)
    throw Error("sampler: global batch B = " + std::to_string(batch) + " must be at least 1");
  if (context < 1)
    throw Error("sampler: context T = " + std::to_string(context) + " must be at least 1");
  if (n < static_cast<std::int64_t>(context) + 2)
    throw Error("sampler: the corpus has " + std::to_string(n) +
                " tokens, too few for context T = " + std::to_string(context) +
                ": it needs at least T + 2 = " + std::to_string(context + 2) +
                " (T inputs, the shifted targets and N - T - 1 >= 1 start positions)");
  CUBELM_ASSERT(n <= std::numeric_limits<std::int64_t>::max() / context,
                "token count times context overflows int64");
}

void Sampler::fill(const std::vector<std::int32_t>& tokens, std::int64_t step, Batch& out) const {
  fill_rows(tokens, step, 0, batch_, out);
}

void Sampler::fill_rows(const std::vector<std::int32_t>& tokens, std::int64_t step, int first,
                        int count, Batch& out) const {
  CUBELM_ASSERT(static_cast<std::int64_t>(tokens.size()) == n_,
                "the sampler was built for " + std::to_string(n_) + " tokens, got " +
                    std::to_string(tokens.size()));
  CUBELM_ASSERT(step >= 0, "step must be >= 0");
  CUBELM_ASSERT(first >= 0 && count >= 0 && first + count <= batch_,
                "rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                    ") outside the batch of " + std::to_string(batch_));
  const std::size_t T = static_cast<std::size_t>(context_);
  out.B = count;
  out.T = context_;
  out.first = first;
  out.inputs.resize(static_cast<std::size_t>(count) * T);
  out.targets.resize(static_cast<std::size_t>(count) * T);
  for (int r = 0; r < count; ++r) {
    const std::int64_t s = start(step, first + r);
    CUBELM_ASSERT(s >= 0 && s + context_ + 1 <= n_, "sequence start out of range");
    const auto* src = tokens.data() + s;
    std::copy(src, src + T, out.inputs.begin() + r * T);
    std::copy(src + 1, src + T + 1, out.targets.begin() + r * T);
  }
}

SequentialSampler::SequentialSampler(std::int64_t n, int batch, int context)
    : Sampler(n, batch, context) {}

std::int64_t SequentialSampler::start(std::int64_t step, std::int64_t k) const {
  CUBELM_ASSERT(step >= 0 && k >= 0 && k < batch(), "sequence index outside the batch");
  const std::int64_t m = token_count() - context() - 1;
  const std::int64_t i = step * batch() + k;
  // ((i mod m)·T) mod m equals (i·T) mod m and cannot overflow (m·T < 2^63).
  return ((i % m) * context()) % m;
}

ShuffleSampler::ShuffleSampler(std::int64_t n, int batch, int context, std::uint64_t seed)
    : Sampler(n, batch, context), seed_(seed), windows_((n - 1) / context) {}

std::vector<std::int64_t> ShuffleSampler::permutation(std::int64_t epoch) const {
  return cached_permutation(epoch);
}

const std::vector<std::int64_t>& ShuffleSampler::cached_permutation(std::int64_t epoch) const {
  CUBELM_ASSERT(epoch >= 0, "epoch must be >= 0");
  if (epoch != cached_epoch_) {
    perm_.resize(static_cast<std::size_t>(windows_));
    for (std::int64_t w = 0; w < windows_; ++w)
      perm_[w] = w;
    Rng rng(seed_, static_cast<std::uint64_t>(epoch));
    for (std::int64_t j = windows_ - 1; j >= 1; --j)
      std::swap(perm_[j], perm_[rng.below(static_cast<std::uint64_t>(j + 1))]);
    cached_epoch_ = epoch;
  }
  return perm_;
}

std::int64_t ShuffleSampler::start(std::int64_t step, std::int64_t k) const {
  CUBELM_ASSERT(step >= 0 && k >= 0 && k < batch(), "sequence index outside the batch");
  const std::int64_t i = step * batch() + k;
  return cached_permutation(i / windows_)[i % windows_] * context();
}

std::unique_ptr<Sampler> make_sampler(const std::string& kind, std::int64_t n, int batch,
                                      int context, std::uint64_t seed) {
  if (kind == "sequential")
    return std::make_unique<SequentialSampler>(n, batch, context);
  if (kind == "shuffle")
    return std::make_unique<ShuffleSampler>(n, batch, context, seed);
  throw Error("sampler \"" + kind + "\" is not known: use \"sequential\" or \"shuffle\"");
}

} // namespace cubelm::io
