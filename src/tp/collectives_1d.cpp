// The collectives of 1d tensor parallelism (mode_1d.cpp; "none" is its one-rank case),
// per piece and pass, for tp/collectives.hpp. N tokens, H features, p ranks.
//
// Without sequence parallelism every rank holds all N rows: a row-parallel output (the
// attention projection, W2) and a column-parallel input's gradient (QKV, W1) are
// all-reduced (N H), the lookup's rows summed over the vocabulary slices, the head's input
// gradient likewise, and where the vocabulary is split the loss's row maxima, then its
// sums of exponentials and target logits (3 N in two calls). An MoE layer's shares'
// outputs and input gradients are all-gathered (N H / p each; with expert tensor
// parallelism collectives.cpp all-reduces them instead).
//
// With sequence parallelism each all-reduce of N H rows becomes a reduce-scatter and an
// all-gather of this rank's N / p rows: a LayerNorm's output is gathered and a
// row-parallel output reduce-scattered forward, the reverse backward; the LayerNorm and
// row-parallel bias gradients are summed over the group (H each). An MoE layer's output
// is its rows already (no reduce-scatter forward) and it takes its rows of the output's
// gradient (no all-gather backward); it has no b2.

#include "collectives_modes.hpp"

namespace cubelm::tp::detail {

void describe_1d(const Sizes& s, Piece piece, Pass pass, const Describe& add) {
  using comm::Kind;
  const bool fwd = pass == Pass::forward;
  const double N = s.N, H = s.H, p = s.p();
  if (s.layout.sequence_parallel && s.layout.tp > 1) {
    const double block = N * H / p;
    switch (piece) {
    case Piece::lookup: // rows summed into this rank's block; the gradient gathered
      add("tp", fwd ? Kind::reduce_scatter : Kind::all_gather, 1, block);
      break;
    case Piece::attention: // LayerNorm 1 and the projection (bo)
    case Piece::mlp:       // LayerNorm 2 and W2 (b2)
      add("tp", Kind::all_gather, 1, block);
      add("tp", Kind::reduce_scatter, 1, block);
      if (!fwd) // the gradients of the LayerNorm's vectors and of the bias
        add("tp", Kind::all_reduce, 3, 3 * H, kComputeElement);
      break;
    case Piece::moe: // LayerNorm 2 only
      add("tp", fwd ? Kind::all_gather : Kind::reduce_scatter, 1, block);
      if (!fwd)
        add("tp", Kind::all_reduce, 2, 2 * H, kComputeElement);
      break;
    case Piece::head: // ln_f's output gathered; backward (the loss runs there) the loss's
                      // row statistics, ln_f's gamma and beta, its gradient reduce-scattered
      add("tp", fwd ? Kind::all_gather : Kind::reduce_scatter, 1, block);
      if (!fwd)
        add("tp", Kind::all_reduce, 4, 3 * N + 2 * H, kComputeElement);
      break;
    case Piece::table:
      break;
    }
    return;
  }
  switch (piece) {
  case Piece::lookup:
    if (fwd)
      add("tp", Kind::all_reduce, 1, N * H);
    break;
  case Piece::attention:
  case Piece::mlp:
    add("tp", Kind::all_reduce, 1, N * H);
    break;
  case Piece::moe:
    if (s.layout.tp > 1 && s.layout.etp == 1)
      add("tp", Kind::all_gather, 1, N * H / p);
    break;
  case Piece::head: // the loss runs in the backward: its statistics, the input's gradient
    if (!fwd) {
      add("tp", Kind::all_reduce, 1, N * H);
      if (s.layout.tp > 1) // the row maxima and the sums (statistics)
        add("tp", Kind::all_reduce, 2, 3 * N, kComputeElement);
    }
    break;
  case Piece::table:
    break;
  }
}

} // namespace cubelm::tp::detail
