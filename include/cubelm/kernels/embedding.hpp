#pragma once
/// \file
/// \brief Token and position embeddings of GPT-2, forward and backward side by side, and the
/// token index (a stable sort of the rows by token, on the device) that makes the token backward
/// deterministic.
///
/// Activations are matrices [N, H] (N = tokens, rows grouped by whole
/// sequences). Conventions: parameter gradients accumulate (+=) so that
/// micro-batches add up; activation gradients are assigned unless a function
/// says it accumulates. Every reduction runs in a fixed order, so results are
/// bitwise reproducible for a given thread count.

#include "cubelm/kernels/views.hpp"

#include <cstdint>
#include <vector>

namespace cubelm::kernels {

/// \brief The positions of the tokens a rank holds of each sequence. Without context
/// parallelism all of them, in order; with it (cp ranks, this one `rank`), the sequence of
/// local x cp tokens is cut into 2 cp chunks of local / 2 and the rank holds chunks
/// `rank` and 2 cp - 1 - `rank`, in that order (docs/grid.md, "Context parallelism").
struct Positions {
  int local = 0; ///< tokens of a sequence here
  int cp = 1;
  int rank = 0;
  Positions() = default;
  /// \brief Every position of sequences of `seq` tokens.
  Positions(int seq) : local(seq) {} // NOLINT(google-explicit-constructor): a plain length
  Positions(int local_, int cp_, int rank_) : local(local_), cp(cp_), rank(rank_) {}
  /// \brief Tokens of a whole sequence: local x cp.
  int total() const { return local * cp; }
  /// \brief The position in its sequence of the sequence's t-th token here.
  KOKKOS_INLINE_FUNCTION int global(int t) const {
    if (cp == 1)
      return t;
    const int half = local / 2;
    return t < half ? rank * half + t : (2 * cp - 1 - rank) * half + (t - half);
  }
};

/// \brief Rows that hold each token, for a deterministic embedding backward.
struct TokenIndex {
  Kokkos::View<int*, MemSpace>
      offsets; ///< [V+1]: rows of token v are positions[offsets[v] .. offsets[v+1])
  Kokkos::View<int*, MemSpace> positions; ///< [N]: row numbers sorted by token, then by row
};

/// \brief Builds TokenIndexes on the device into buffers it keeps: after the first build
/// of a given vocabulary slice and token count, building allocates nothing and never
/// waits for the device.
class TokenIndexer {
public:
  /// \brief The index of the device tokens of the slice [first, first + count) (token t is
  /// entry t - first; other tokens are left out), by a stable radix sort of the rows on
  /// `exec`. Valid until the next build.
  const TokenIndex& build(const ExecSpace& exec, const Tokens& tokens, int first, int count);

private:
  TokenIndex index_;
  // Sort keys, the row order of the sort's two passes, the digit counts of each block
  // of rows and where they start.
  Kokkos::View<int*, MemSpace> keys_, order_[2], counts_, starts_;
};

/// \brief Builds the TokenIndex of `tokens` (host ids < vocab) with a TokenIndexer.
TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int vocab);
/// \brief The same for the vocabulary slice [first, first + count): other tokens are left
/// out and token t is entry t - first.
TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int first, int count);

/// \brief y[n,:] = wte[tok[n] - first,:] for tokens of this vocabulary slice, else 0.
template <class T>
void embedding_lookup(const ExecSpace& exec, const Tokens& tok, const Mat<T>& wte, int first,
                      const Mat<T>& y);
/// \brief y[n,:] += wpe[pos.global((first_row + n) mod pos.local),:] (y: rows from
/// `first_row` on of the micro-batch's tokens here).
template <class T>
void position_add(const ExecSpace& exec, const Mat<T>& wpe, Positions pos, const Mat<T>& y,
                  std::int64_t first_row = 0);
/// \brief dwte[v,:] += sum of dy over the rows that hold token v (index of make_token_index).
template <class T>
void token_backward(const ExecSpace& exec, const TokenIndex& index, const Mat<T>& dy,
                    const Mat<compute_t<T>>& dwte);
/// \brief dwpe[pos.global(t),:] += sum over sequences of dy at their t-th token here.
template <class T>
void position_backward(const ExecSpace& exec, const Mat<T>& dy, Positions pos,
                       const Mat<compute_t<T>>& dwpe);

/// \brief y[n,:] = wte[tok[n],:] + wpe[n mod seq_len,:].
template <class T>
void embedding_forward(const ExecSpace& exec, const Tokens& tok, const Mat<T>& wte,
                       const Mat<T>& wpe, int seq_len, const Mat<T>& y);

/// \brief dwte[v,:] += sum of dy over the rows holding token v; dwpe[t,:] += sum over sequences
/// of dy at position t.
template <class T>
void embedding_backward(const ExecSpace& exec, const TokenIndex& index, const Mat<T>& dy,
                        int seq_len, const Mat<compute_t<T>>& dwte, const Mat<compute_t<T>>& dwpe);

} // namespace cubelm::kernels
