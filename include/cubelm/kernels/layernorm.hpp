#pragma once
/// \file
/// \brief LayerNorm of GPT-2, forward and backward, on whole rows or in pieces for rows whose
/// features are split over ranks.
///
/// Activations are matrices [N, H] (N = tokens, rows grouped by whole
/// sequences). Conventions: parameter gradients accumulate (+=) so that
/// micro-batches add up; activation gradients are assigned unless a function
/// says it accumulates. Every reduction runs in a fixed order, so results are
/// bitwise reproducible for a given thread count. `T` stores the activations and
/// gamma and beta; the row statistics, the row sums and the parameter gradients are
/// compute_t<T> (elementwise.hpp).

#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::kernels {

/// \brief LayerNorm epsilon of GPT-2.
constexpr double kLayerNormEps = 1e-5;

/// LayerNorm in pieces, for rows whose features may be split over ranks: each piece
/// works on this rank's columns, the caller sums its per-row results over the ranks
/// that share the rows, and `features` is the row's whole width.
/// \brief s[n] = sum of row n.
template <class T>
void row_sum(const ExecSpace& exec, const Mat<T>& x, const Vec<compute_t<T>>& s);
/// \brief v[n] = sum over row n of (x - s[n] / features)^2 (s: the whole row's sum).
template <class T>
void row_centered_squares(const ExecSpace& exec, const Mat<T>& x, const Vec<compute_t<T>>& s,
                          std::int64_t features, const Vec<compute_t<T>>& v);
/// \brief Called with mean = whole-row sums and rstd = whole-row centred squares, which it
/// turns into the mean and 1/sqrt(var + eps); y = (x - mean) * rstd * gamma + beta.
template <class T>
void layernorm_normalize(const ExecSpace& exec, const Mat<T>& x, std::int64_t features,
                         const Vec<T>& gamma, const Vec<T>& beta, const Mat<T>& y,
                         const Vec<compute_t<T>>& mean, const Vec<compute_t<T>>& rstd);
/// \brief sums(n,0) = sum of dy gamma over row n, sums(n,1) = sum of dy gamma xhat.
template <class T>
void layernorm_backward_sums(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                             const Vec<T>& gamma, const Vec<compute_t<T>>& mean,
                             const Vec<compute_t<T>>& rstd, const Mat<compute_t<T>>& sums);
/// \brief dx += rstd (dy gamma - sums(n,0) / features - xhat sums(n,1) / features), with the
/// whole-row sums.
template <class T>
void layernorm_backward_input(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                              const Vec<T>& gamma, const Vec<compute_t<T>>& mean,
                              const Vec<compute_t<T>>& rstd, const Mat<compute_t<T>>& sums,
                              std::int64_t features, const Mat<T>& dx);
/// \brief dgamma += column sums of dy xhat; dbeta += column sums of dy.
template <class T>
void layernorm_backward_params(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                               const Vec<compute_t<T>>& mean, const Vec<compute_t<T>>& rstd,
                               const Vec<compute_t<T>>& dgamma, const Vec<compute_t<T>>& dbeta);

/// \brief The pieces above on whole rows:
/// y = (x - mean) * rstd * gamma + beta per row; keeps mean and rstd for backward.
template <class T>
void layernorm_forward(const ExecSpace& exec, const Mat<T>& x, const Vec<T>& gamma,
                       const Vec<T>& beta, const Mat<T>& y, const Vec<compute_t<T>>& mean,
                       const Vec<compute_t<T>>& rstd);

/// \brief dx += LayerNorm input gradient; dgamma += sum dy * xhat; dbeta += sum dy
/// (whole rows; allocates its row buffer on every call).
template <class T>
void layernorm_backward(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& x,
                        const Vec<T>& gamma, const Vec<compute_t<T>>& mean,
                        const Vec<compute_t<T>>& rstd, const Mat<T>& dx,
                        const Vec<compute_t<T>>& dgamma, const Vec<compute_t<T>>& dbeta);

} // namespace cubelm::kernels
