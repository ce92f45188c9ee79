#pragma once
/// \file
/// \brief Elementwise and row-wise layers of GPT-2, forward and backward side by side.
///
/// Activations are matrices [N, H] (N = tokens, rows grouped by whole
/// sequences). Conventions: parameter gradients accumulate (+=) so that
/// micro-batches add up; activation gradients are assigned unless a function
/// says it accumulates. Every reduction runs in a fixed order, so results are
/// bitwise reproducible for a given thread count.

#include "cubelm/kernels/views.hpp"

#include <vector>

namespace cubelm::kernels {

/// \brief LayerNorm epsilon of GPT-2.
constexpr double kLayerNormEps = 1e-5;

/// \brief Rows that hold each token, for a deterministic embedding backward.
struct TokenIndex {
  Kokkos::View<int*, MemSpace>
      offsets; ///< [V+1]: rows of token v are positions[offsets[v] .. offsets[v+1])
  Kokkos::View<int*, MemSpace> positions; ///< [N]: row numbers sorted by token, then by row
};

/// \brief Builds the TokenIndex of `tokens` (host ids < vocab) with a stable counting sort.
TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int vocab);
/// \brief The same for the vocabulary slice [first, first + count): other tokens are left
/// out and token t is entry t - first.
TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int first, int count);

/// \brief y[n,:] = wte[tok[n] - first,:] for tokens of this vocabulary slice, else 0.
template <class T>
void embedding_lookup(const ExecSpace& exec, const Tokens& tok, const Mat<T>& wte, int first,
                      const Mat<T>& y);
/// \brief y[n,:] += wpe[n mod seq_len,:].
template <class T>
void position_add(const ExecSpace& exec, const Mat<T>& wpe, int seq_len, const Mat<T>& y);
/// \brief dwte[v,:] += sum of dy over the rows that hold token v (index of make_token_index).
template <class T>
void token_backward(const ExecSpace& exec, const TokenIndex& index, const Mat<T>& dy,
                    const Mat<T>& dwte);
/// \brief dwpe[t,:] += sum over sequences of dy at position t.
template <class T>
void position_backward(const ExecSpace& exec, const Mat<T>& dy, int seq_len, const Mat<T>& dwpe);

/// \brief y[n,:] = wte[tok[n],:] + wpe[n mod seq_len,:].
template <class T>
void embedding_forward(const ExecSpace& exec, const Tokens& tok, const Mat<T>& wte,
                       const Mat<T>& wpe, int seq_len, const Mat<T>& y);

/// \brief dwte[v,:] += sum of dy over the rows holding token v; dwpe[t,:] += sum over sequences
/// of dy at position t.
template <class T>
void embedding_backward(const ExecSpace& exec, const TokenIndex& index, const Mat<T>& dy,
                        int seq_len, const Mat<T>& dwte, const Mat<T>& dwpe);

/// LayerNorm in pieces, for rows whose features may be split over ranks: each piece
/// works on this rank's columns, the caller sums its per-row results over the ranks
/// that share the rows, and `features` is the row's whole width.
/// \brief s[n] = sum of row n.
template <class T>
void row_sum(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& s);
/// \brief v[n] = sum over row n of (x - s[n] / features)^2 (s: the whole row's sum).
template <class T>
void row_centered_squares(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& s,
                          std::int64_t features, const Vec<T>& v);
/// \brief Called with mean = whole-row sums and rstd = whole-row centred squares, which it
/// turns into the mean and 1/sqrt(var + eps); y = (x - mean) * rstd * gamma + beta.
template <class T>
void layernorm_normalize(const ExecSpace& exec, const Mat<T>& x, std::int64_t features,
                         const Vec<T>& gamma, const Vec<T>& beta, const Mat<T>& y,
                         const Vec<T>& mean, const Vec<T>& rstd);
/// \brief sums(n,0) = sum of dy gamma over row n, sums(n,1) = sum of dy gamma xhat.
template <class T>
void layernorm_backward_sums(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                             const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                             const Mat<T>& sums);
/// \brief dx += rstd (dy gamma - sums(n,0) / features - xhat sums(n,1) / features), with the
/// whole-row sums.
template <class T>
void layernorm_backward_input(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                              const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                              const Mat<T>& sums, std::int64_t features, const Mat<T>& dx);
/// \brief dgamma += column sums of dy xhat; dbeta += column sums of dy.
template <class T>
void layernorm_backward_params(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                               const Vec<T>& mean, const Vec<T>& rstd, const Vec<T>& dgamma,
                               const Vec<T>& dbeta);

/// \brief The pieces above on whole rows:
/// y = (x - mean) * rstd * gamma + beta per row; keeps mean and rstd for backward.
template <class T>
void layernorm_forward(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& gamma,
                       const Vec<T>& beta, const Mat<T>& y, const Vec<T>& mean, const Vec<T>& rstd);

/// \brief dx += LayerNorm input gradient; dgamma += sum dy * xhat; dbeta += sum dy
/// (whole rows; allocates its row buffer on every call).
template <class T>
void layernorm_backward(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                        const Vec<T>& gamma, const Vec<T>& mean, const Vec<T>& rstd,
                        const Mat<T>& dx, const Vec<T>& dgamma, const Vec<T>& dbeta);

/// \brief y[n,:] += b.
template <class T>
void bias_add(const ExecSpace& exec, const Mat<T>& y, const Vec<T>& b);

/// \brief db += column sums of dy.
template <class T>
void bias_backward(const ExecSpace& exec, const Mat<T>& dy, const Vec<T>& db);

/// \brief y = gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); keeps the
/// tanh values in `th` for the backward pass (tanh is the costly part of both).
template <class T>
void gelu_forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, const Mat<T>& th);

/// \brief dx = dy * gelu_tanh'(x), with `th` from gelu_forward.
template <class T>
void gelu_backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& th, const Mat<T>& dy,
                   const Mat<T>& dx);

/// \brief y += x (the residual connection), elementwise.
template <class T>
void add_inplace(const ExecSpace& exec, const Mat<T>& y, const Mat<T>& x);

/// \brief Per-row cross-entropy on logits [N, V] with targets: losses[n] = logsumexp - logit.
///
/// When `grad_scale` is non-zero the logits are overwritten by their gradient
/// grad_scale * (softmax - onehot(target)); pass 1/(tokens in the global batch)
/// for the mean loss. Numerically stable (the row maximum is subtracted). This is
/// the vocabulary-parallel kernels below with the whole vocabulary as one slice
/// (it allocates their row buffers on every call).
template <class T>
void cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Tokens& targets,
                   const Vec<T>& losses, T grad_scale);

/// \brief Vocabulary-parallel cross-entropy, step 1: mx[n] = max of this slice's logits.
template <class T>
void row_max(const ExecSpace& exec, const Mat<T>& logits, const Vec<T>& mx);
/// \brief Step 2 (mx now the maximum over all slices): stats(n,0) = sum of exp(l - mx) over
/// the slice, stats(n,1) = target logit - mx when the target is in [first, first + cols), else 0.
template <class T>
void row_sumexp_target(const ExecSpace& exec, const Mat<T>& logits, const Vec<T>& mx,
                       const Tokens& targets, int first, const Mat<T>& stats);
/// \brief Step 3 (stats summed over all slices): losses[n] = log(stats(n,0)) - stats(n,1); with
/// grad_scale != 0 the logits become grad_scale (softmax - onehot) of this slice.
template <class T>
void vocab_cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Vec<T>& mx,
                         const Mat<T>& stats, const Tokens& targets, int first,
                         const Vec<T>& losses, T grad_scale);

} // namespace cubelm::kernels
