#pragma once
/// \file
/// \brief Softmax cross-entropy of GPT-2's logits, on the whole vocabulary or on one
/// vocabulary slice per rank (the vocabulary-parallel steps).
///
/// Logits are matrices [N, V] (N = tokens, V = this rank's vocabulary columns).
/// Every reduction runs in a fixed order, so results are bitwise reproducible
/// for a given thread count. `T` stores the logits (and the exponentials and gradients
/// that replace them); the maxima, sums, losses and the scale are compute_t<T>, the
/// type every step computes in (elementwise.hpp).

#include "cubelm/kernels/views.hpp"

namespace cubelm::kernels {

/// \brief Per-row cross-entropy on logits [N, V] with targets: losses[n] = logsumexp - logit.
///
/// When `grad_scale` is non-zero the logits are overwritten by their gradient
/// grad_scale * (softmax - onehot(target)); pass 1/(tokens in the global batch)
/// for the mean loss. Numerically stable (the row maximum is subtracted). This is
/// whole_vocab_cross_entropy with every column a real token.
template <class T>
void cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Tokens& targets,
                   const Vec<compute_t<T>>& losses, compute_t<T> grad_scale);

/// \brief The three vocabulary-parallel steps below in one kernel, for logits [N, V] that
/// hold the whole vocabulary (no other rank holds columns of these rows): the first
/// `valid` columns are real tokens, the others padding. The same operations in the same
/// order as the steps with one slice, so the same bits, with each row read from memory
/// once instead of three times.
template <class T>
void whole_vocab_cross_entropy(const ExecSpace& exec, const Mat<T>& logits, const Tokens& targets,
                               std::int64_t valid, const Vec<compute_t<T>>& losses,
                               compute_t<T> grad_scale);

/// Vocabulary-parallel cross-entropy in three steps, on a slice of `cols` logit columns
/// of which the first `valid` are real tokens and the others pad the vocabulary
/// (never predicted: left out of the maximum and the sums, gradient 0).
/// \brief Step 1: mx[n] = max of this slice's valid logits (the lowest float when none).
template <class T>
void row_max(const ExecSpace& exec, const Mat<T>& logits, std::int64_t valid,
             const Vec<compute_t<T>>& mx);
/// \brief Step 2 (mx now the maximum over all slices): stats(n,0) = sum of exp(l - mx) over
/// the slice, stats(n,1) = target logit - mx when the target is in [first, first + valid),
/// else 0. The valid logits are replaced by exp(l - mx), which step 3 reuses (one
/// exponential per logit).
template <class T>
void row_sumexp_target(const ExecSpace& exec, const Mat<T>& logits, const Vec<compute_t<T>>& mx,
                       const Tokens& targets, int first, std::int64_t valid,
                       const Mat<compute_t<T>>& stats);
/// \brief Step 3 (stats summed over all slices; `logits` as step 2 left them): losses[n] =
/// log(stats(n,0)) - stats(n,1); with grad_scale != 0 the logits become grad_scale (softmax -
/// onehot) of this slice, 0 in its padding columns.
template <class T>
void vocab_cross_entropy(const ExecSpace& exec, const Mat<T>& logits,
                         const Mat<compute_t<T>>& stats, const Tokens& targets, int first,
                         std::int64_t valid, const Vec<compute_t<T>>& losses,
                         compute_t<T> grad_scale);

/// \brief For generation: out[first + v] = logits(n, v), v < valid, for each row n whose
/// mark is non-zero; every other entry of out is left as it is. One rank's part of the
/// logits of the marked rows, placed where their columns belong in the whole vocabulary.
template <class T>
void copy_marked_rows(const ExecSpace& exec, const Mat<T>& logits, const Tokens& marks, int first,
                      std::int64_t valid, const Vec<float>& out);

} // namespace cubelm::kernels
