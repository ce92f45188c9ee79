#include "cubelm/model/sampling.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/core/random.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace cubelm::model {

namespace {
std::string text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}
} // namespace

std::string check_sampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || std::isinf(o.temperature))
    return "--temperature " + text(o.temperature) +
           ": must be a finite number >= 0 (0 chooses the most probable token)";
  if (o.top_k < 0)
    return "--top-k " + std::to_string(o.top_k) + ": must be >= 0 (0 keeps every token)";
  if (!(o.top_p > 0 && o.top_p <= 1))
    return "--top-p " + text(o.top_p) + ": must be in (0, 1] (1 keeps every token)";
  return "";
}

TokenSampler::TokenSampler(const SamplingOptions& options)
    : options_(options), state_(options.seed) {
  const std::string bad = check_sampling(options);
  if (!bad.empty())
    throw Error(bad);
}

std::int32_t TokenSampler::argmax(const float* logits, std::int64_t vocab) {
  std::int64_t best = 0;
  for (std::int64_t v = 0; v < vocab; ++v) {
    if (std::isnan(logits[v]))
      throw Error("logit of token " + std::to_string(v) +
                  " is NaN: the checkpoint's weights are not finite");
    if (logits[v] > logits[best])
      best = v;
  }
  return static_cast<std::int32_t>(best);
}

std::int32_t TokenSampler::next(const float* logits, std::int64_t vocab) {
  const std::int32_t greedy = argmax(logits, vocab); // also refuses NaN
  if (options_.temperature == 0)
    return greedy;
  // The candidates, most probable first; equal logits in id order.
  const auto before = [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  order_.resize(static_cast<std::size_t>(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  std::size_t kept = order_.size();
  if (options_.top_k > 0 && static_cast<std::size_t>(options_.top_k) < kept) {
    kept = static_cast<std::size_t>(options_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(kept),
                      order_.end(), before);
  } else {
    std::sort(order_.begin(), order_.end(), before);
  }
  // softmax(logit / T) over the kept candidates, from the largest (probability 1 before
  // normalising), so no exponential overflows.
  const double top = logits[order_[0]];
  weight_.resize(kept);
  double total = 0;
  for (std::size_t i = 0; i < kept; ++i) {
    weight_[i] = std::exp((static_cast<double>(logits[order_[i]]) - top) / options_.temperature);
    total += weight_[i];
  }
  if (options_.top_p < 1) {
    double sum = 0;
    std::size_t n = 0;
    while (n < kept) {
      sum += weight_[n++];
      if (sum >= options_.top_p * total)
        break;
    }
    kept = n;
    total = sum;
  }
  // The top 53 bits of one splitmix64 output: a uniform double in [0, 1).
  const double u = static_cast<double>(splitmix64_next(state_) >> 11) * 0x1.0p-53;
  const double target = u * total;
  double sum = 0;
  for (std::size_t i = 0; i < kept; ++i) {
    sum += weight_[i];
    if (sum > target)
      return order_[i];
  }
  return order_[kept - 1]; // u * total rounded up to the whole sum
}

} // namespace cubelm::model
