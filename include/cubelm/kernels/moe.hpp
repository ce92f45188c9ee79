#pragma once
/// \file
/// \brief Mixture-of-Experts routing on one device (docs/model.md): the router's softmax and
/// top-k, dispatch of (token, choice) pairs to contiguous per-expert rows with an optional
/// capacity, the gated combine, the load-balancing loss, and their backward passes.
///
/// N tokens (rows of x), E experts, k choices per token. Pair i = j N + t is choice j of
/// token t; pairs are given to experts in this order (every token's first choice before
/// any second choice, tokens in row order), so with a capacity the later choices are the
/// ones dropped. Conventions as elsewhere: parameter gradients accumulate, activation
/// gradients are assigned unless a function says it accumulates, every sum runs in a
/// fixed order.

#include "cubelm/kernels/embedding.hpp"
#include "cubelm/kernels/views.hpp"

#include <cstdint>

namespace cubelm::kernels {

using IntVec = Kokkos::View<int*, MemSpace>;
using IntMat = Kokkos::View<int**, Kokkos::LayoutRight, MemSpace>;

/// \brief What an MoE layer keeps of one micro-batch from forward to backward: the routing
/// in compute_t<T> (a bf16 model routes in float), the rows in T.
template <class T>
struct MoeSaved {
  Mat<compute_t<T>> probs;    ///< [N, E] router probabilities
  IntMat choice;              ///< [N, k] chosen experts, most probable first
  Mat<compute_t<T>> gate;     ///< [N, k] their probabilities renormalised to sum 1
  IntMat slot;                ///< [N, k] row of the pair in the expert rows, -1 when dropped
  IntVec pairs;               ///< [R] pair (j N + t) of each expert row
  IntVec offsets;             ///< [E + 1] rows of expert e: [offsets(e), offsets(e + 1))
  Vec<compute_t<T>> fraction; ///< [E] f_e: share of the N k pairs routed to e (before dropping)
  Mat<T> h, g, th;            ///< [Rr, F] the hidden layer, GELU and its tanh of the rows run here
  Mat<T> out;                 ///< [R, H] the experts' outputs of this rank's pairs, before gating
  /// expert parallelism: [Rr, H] the rows received for this rank's experts (else empty)
  Mat<T> xr;
  /// offsets on the host: the expert matmuls' sizes
  Kokkos::View<int*, Kokkos::HostSpace> host_offsets;
  /// expert parallelism: [P E / P] rows received from each of the P ranks for each expert
  /// here (else empty)
  Kokkos::View<int*, Kokkos::HostSpace> host_received;

  /// \brief Buffers for N tokens, E experts, k choices, R expert rows, width H, hidden F;
  /// with `peers` > 1 (expert parallelism over that many ranks) the experts here run on
  /// up to `received` rows, else on the R rows.
  static MoeSaved make(std::int64_t n, int experts, int k, std::int64_t rows, std::int64_t hidden,
                       std::int64_t ffn, int peers = 1, std::int64_t received = 0);
  /// \brief Device bytes of the buffers.
  std::int64_t bytes() const;
  /// \brief Calls `f(view)` for each device buffer (labelled "cubelm::moe/<name>", the names of
  /// tp::moe_saved), not the host copies of the counts.
  template <class F>
  void for_each_buffer(F&& f) const {
    f(probs);
    f(choice);
    f(gate);
    f(slot);
    f(pairs);
    f(offsets);
    f(fraction);
    f(h);
    f(g);
    f(th);
    f(out);
    f(xr);
  }
};

/// The routing kernels (moe_route, moe_dispatch, moe_route_backward, moe_aux_loss) take
/// float or double; the row kernels (moe_gather, moe_combine and their backward) also bf16.
/// \brief probs[n,:] = softmax(probs[n,:]) in place (the router logits on entry); choice[n,:]
/// the k most probable experts (ties to the lower index), gate[n,:] their probabilities
/// divided by their sum.
template <class T>
void moe_route(const ExecSpace& exec, const Mat<T>& probs, const IntMat& choice,
               const Mat<T>& gate);

/// \brief Gives the pairs of `choice` rows of their experts: expert e takes its first
/// `capacity` pairs in pair order (all of them when capacity < 0). Fills slot, pairs,
/// offsets and fraction; `keys` ([N k]) and `sorter` are scratch (a stable radix sort by
/// expert).
template <class T>
void moe_dispatch(const ExecSpace& exec, const IntMat& choice, std::int64_t capacity,
                  const Tokens& keys, TokenIndexer& sorter, const IntMat& slot, const IntVec& pairs,
                  const IntVec& offsets, const Vec<T>& fraction);

/// \brief xin[r,:] = x[token of pairs(r),:] for r < rows.
template <class T>
void moe_gather(const ExecSpace& exec, const Mat<T>& x, const IntVec& pairs, std::int64_t rows,
                const Mat<T>& xin);

/// \brief y[t,:] = sum over the kept choices j of gate(t,j) out[slot(t,j),:] (assigned).
template <class T>
void moe_combine(const ExecSpace& exec, const Mat<T>& out, const IntMat& slot,
                 const Mat<compute_t<T>>& gate, const Mat<T>& y);

/// \brief Backward of moe_combine: dout[r,:] = gate dy[t,:] for the rows r < rows, and
/// dgate(t,j) = dy[t,:] . out[slot(t,j),:] (0 for a dropped pair).
template <class T>
void moe_combine_backward(const ExecSpace& exec, const Mat<T>& dy, const Mat<T>& out,
                          const IntMat& slot, const Mat<compute_t<T>>& gate, const IntVec& pairs,
                          std::int64_t rows, const Mat<T>& dout, const Mat<compute_t<T>>& dgate);

/// \brief dx[t,:] += sum over the kept choices j of dxin[slot(t,j),:].
template <class T>
void moe_scatter_add(const ExecSpace& exec, const Mat<T>& dxin, const IntMat& slot,
                     const Mat<T>& dx);

/// \brief The router logits' gradient (assigned to dlogits [N, E]) from the gates'
/// gradient through the renormalisation and the softmax, plus aux_scale f_e added to the
/// gradient of every probability p[t,e] (the load-balancing loss; the selection itself
/// has no gradient).
template <class T>
void moe_route_backward(const ExecSpace& exec, const Mat<T>& probs, const IntMat& choice,
                        const Mat<T>& gate, const Mat<T>& dgate, const Vec<T>& fraction,
                        T aux_scale, const Mat<T>& dlogits);

/// \brief total() += scale sum_e f_e P_e, P_e the mean of probs[:,e] (`means`: [E] scratch).
template <class T>
void moe_aux_loss(const ExecSpace& exec, const Mat<T>& probs, const Vec<T>& fraction, double scale,
                  const Kokkos::View<double*, MemSpace>& means,
                  const Kokkos::View<double*, MemSpace>& total);

} // namespace cubelm::kernels
