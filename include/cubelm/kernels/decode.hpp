#pragma once
/// \file
/// \brief Attention of new positions over a key/value cache: what text generation adds to
/// the training kernels (model/generator.hpp, docs/generate.md).
///
/// A cache holds the keys (or values) of every position of one sequence so far, token
/// major [positions, H] as the training activations are: head h owns the columns
/// [h d, (h + 1) d), d = H / heads. The new positions' keys and values are written into
/// their rows of the cache before the attention runs, so that a new query sees itself.

#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::kernels {

/// \brief Causal attention of `n` new query rows q [n, H] at positions first, first + 1,
/// ..., first + n - 1 of the sequence, over the cached keys k and values v ([at least
/// first + n, H]): out(i, h d + j) = sum over s <= first + i of p(s) v(s, h d + j), with
/// p = softmax over those s of q(i, h) . k(s, h) / sqrt(d), per head h. `scores`
/// [n * heads, at least first + n] is scratch (it ends holding the probabilities).
/// One team per (row, head); sums in a fixed order, so the bits do not depend on the
/// number of threads.
template <class T>
void cached_attention(const ExecSpace& exec, const Mat<T>& q, const Mat<T>& k, const Mat<T>& v,
                      int heads, std::int64_t first, const Mat<T>& scores, const Mat<T>& out);

/// \brief y[i] = sum over j of a(i, j) x[j], plus beta y[i] when beta != 0 (y is not read
/// when beta = 0): the product of a row-major matrix [m, k] and one vector, for one new
/// position. One team per row of `a`, whose k elements are read once, contiguously, and
/// summed in a fixed order (team_sum). The vendor gemm packs the matrix first when it
/// has one row, and Kokkos Kernels 3.4's gemv takes no BLAS for row-major matrices:
/// both were 2 to 4 times slower on a CPU for the layer shapes of GPT-2.
template <class T>
void matvec(const ExecSpace& exec, const Mat<T>& a, const Vec<T>& x, T beta, const Vec<T>& y);

} // namespace cubelm::kernels
