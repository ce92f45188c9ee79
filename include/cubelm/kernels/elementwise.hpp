#pragma once
/// \file
/// \brief Bias, GELU and the residual add of GPT-2, forward and backward side by side.
///
/// Activations are matrices [N, H] (N = tokens, rows grouped by whole
/// sequences). Conventions: parameter gradients accumulate (+=) so that
/// micro-batches add up; activation gradients are assigned unless a function
/// says it accumulates. Every reduction runs in a fixed order, so results are
/// bitwise reproducible for a given thread count.
///
/// `T` is the storage type of activations and weights (float, double, or bf16 under
/// train.precision = "bf16"): every kernel computes and sums in compute_t<T> (float
/// for bf16) and rounds only where it stores; parameter gradients are compute_t<T>.

#include "cubelm/kernels/views.hpp"

namespace cubelm::kernels {

/// \brief y[n,:] += b.
template <class T>
void bias_add(const ExecSpace& exec, const Mat<T>& y, const Vec<T>& b);

/// \brief db += column sums of dy (summed in compute_t<T>, the gradient's type).
template <class T>
void bias_backward(const ExecSpace& exec, const Mat<T>& dy, const Vec<compute_t<T>>& db);

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

} // namespace cubelm::kernels
