#pragma once
/// \file
/// \brief The two samplers (sequential, shuffle) that cut a corpus into global
/// batches. Their formulas: docs/data.md.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cubelm::io {

/// \brief B sequences of T tokens, row-major [B][T]; row r is sequence
/// first + r of the global batch.
struct Batch {
  int B = 0;
  int T = 0;
  int first = 0; ///< global index of row 0
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
};

/// \brief Where sequence k of step t starts; docs/data.md defines both kinds.
class Sampler {
public:
  virtual ~Sampler() = default;
  /// \brief First token of sequence k (0 <= k < B) of step `step`.
  virtual std::int64_t start(std::int64_t step, std::int64_t k) const = 0;
  /// \brief "sequential" or "shuffle".
  virtual std::string name() const = 0;

  std::int64_t token_count() const { return n_; }
  int batch() const { return batch_; }
  int context() const { return context_; }

  /// \brief Fills the whole global batch of `step` from `tokens` (N of them).
  void fill(const std::vector<std::int32_t>& tokens, std::int64_t step, Batch& out) const;
  /// \brief Fills only rows [first, first + count) of the global batch, as a
  /// data-parallel rank does for its own sequences.
  void fill_rows(const std::vector<std::int32_t>& tokens, std::int64_t step, int first, int count,
                 Batch& out) const;

protected:
  /// Refuses N < T + 2 (and B, T < 1) with an Error.
  Sampler(std::int64_t n, int batch, int context);

private:
  std::int64_t n_;
  int batch_;
  int context_;
};

/// \brief s = ((t·B + k)·T) mod (N − T − 1).
class SequentialSampler : public Sampler {
public:
  SequentialSampler(std::int64_t n, int batch, int context);
  std::int64_t start(std::int64_t step, std::int64_t k) const override;
  std::string name() const override { return "sequential"; }
};

/// \brief Each epoch visits the W = (N − 1) / T windows once, in an order
/// shuffled by (seed, epoch).
///
/// The permutation of the last epoch asked for is cached, so start() is cheap
/// for consecutive steps; the cache makes one object unsafe to share between
/// threads.
class ShuffleSampler : public Sampler {
public:
  ShuffleSampler(std::int64_t n, int batch, int context, std::uint64_t seed);
  std::int64_t start(std::int64_t step, std::int64_t k) const override;
  std::string name() const override { return "shuffle"; }

  /// \brief W, the number of windows of T + 1 tokens.
  std::int64_t windows() const { return windows_; }
  /// \brief perm_e: the window order of epoch e (a copy; W entries).
  std::vector<std::int64_t> permutation(std::int64_t epoch) const;

private:
  const std::vector<std::int64_t>& cached_permutation(std::int64_t epoch) const;

  std::uint64_t seed_;
  std::int64_t windows_;
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> perm_;
};

/// \brief Builds a sampler by name: "sequential" or "shuffle".
std::unique_ptr<Sampler> make_sampler(const std::string& kind, std::int64_t n, int batch,
                                      int context, std::uint64_t seed);

} // namespace cubelm::io
