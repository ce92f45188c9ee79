#pragma once
/// \file
/// \brief The AdamW update (exactly torch.optim.AdamW) and gradient norms.

#include "cubelm/kernels/views.hpp"

namespace cubelm::kernels {

/// \brief Hyper-parameters of one AdamW step.
struct AdamW {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0; ///< 0 for tensors that are not decayed (rank < 2)
  long step = 1;           ///< 1-based step number for the bias corrections
};

/// \brief One AdamW step on a flat parameter tensor, as torch.optim.AdamW does it:
/// p *= 1 - lr wd; m += (1-b1) (g - m) (torch's lerp); v = b2 v + (1-b2) g^2;
/// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
template <class T>
void adamw_update(const ExecSpace& exec, const AdamW& hp, const Vec<T>& p, const Vec<T>& g,
                  const Vec<T>& m, const Vec<T>& v);

/// \brief Sum of squares of x, accumulated in double in a fixed order.
template <class T>
double sum_squares(const ExecSpace& exec, const Vec<T>& x);

/// \brief Sum of x, accumulated in double in a fixed order.
template <class T>
double sum(const ExecSpace& exec, const Vec<T>& x);

/// \brief x *= s.
template <class T>
void scale(const ExecSpace& exec, const Vec<T>& x, T s);

/// \brief A stretch of a flat parameter buffer that one optimizer pass treats alike:
/// elements [first, first + n) of the values and gradients, [moment_first, ...) of
/// the moments. Stretches are at most kOptimChunk elements long, so that one pass
/// over a table of them has work for every thread.
struct OptimChunk {
  std::int64_t first = 0;
  std::int64_t moment_first = 0;
  std::int64_t n = 0;
  bool decay = false;   ///< weight decay applies (matrices)
  bool counted = false; ///< part of the global gradient norm on this rank
};
constexpr std::int64_t kOptimChunk = 4096;
using OptimChunks = Kokkos::View<const OptimChunk*, MemSpace>;

/// \brief Sum of g(i)^2 over the counted chunks, accumulated in double; one kernel, one
/// result, the same for the same table and thread count.
template <class T>
double sum_squares(const ExecSpace& exec, const OptimChunks& chunks, const Vec<T>& g);

/// \brief adamw_update on every chunk in one kernel, with g scaled by `clip` first
/// (clipping without writing the gradients) and `hp.weight_decay` only where `decay`.
template <class T>
void adamw_update(const ExecSpace& exec, const AdamW& hp, T clip, const OptimChunks& chunks,
                  const Vec<T>& p, const Vec<T>& g, const Vec<T>& m, const Vec<T>& v);

} // namespace cubelm::kernels
