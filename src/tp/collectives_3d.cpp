// The collectives of 3d tensor parallelism (the p x p x p cube, mode_3d.cpp) per piece and
// pass, for tp/collectives.hpp. Axes "tp.a", "tp.b", "tp.c" of q ranks and planes
// "tp.ab", "tp.bc", "tp.ca" of q^2; R = N / q^2 rows, X = R H / q elements of an activation
// block, W = H^2 / q^3 of a weight block.
//
// A linear gathers its input over one axis and its weight over another, and
// reduce-scatters its output over the third; backward it gathers the output's gradient
// and reduce-scatters the input's and the weight's gradients (the first and second linear
// of a pair swap the input and output axes). Its bias gradient is summed over a plane, as
// are a LayerNorm's gamma and beta gradients; a LayerNorm sums its row statistics over
// "tp.c" (2 calls forward, 1 backward). wte is gathered over "tp.b" and its gradient
// reduce-scattered once per micro-batch on a stage with the lookup or the head (the table
// piece); the lookup's rows and the head's input move over "tp.a", the logits' blocks over
// "tp.c", the loss's statistics over "tp.a" and the loss (a double) over "tp.bc". An MoE
// layer's rows are made whole over the C axis and back as in 2d (five [R, H / q] blocks
// per layer, two per recomputed one).

#include "collectives_modes.hpp"

namespace cubelm::tp::detail {

void describe_3d(const Sizes& s, Piece piece, Pass pass, const Describe& add) {
  using comm::Kind;
  const bool fwd = pass == Pass::forward;
  const double H = s.H, V = s.V, q = s.q(), R = s.N / (q * q), X = R * H / q,
               W = H * H / (q * q * q);
  const auto layernorm_stats = [&] {
    add("tp.c", Kind::all_reduce, fwd ? 2 : 1, 2 * R, kComputeElement);
  };
  const double C = kComputeElement; // gradients and statistics
  switch (piece) {
  case Piece::lookup:
    add("tp.a", fwd ? Kind::reduce_scatter : Kind::all_gather, 1, X);
    if (!fwd)
      add("tp.b", Kind::all_reduce, 1, s.T * H / q, C); // wpe's gradient
    break;
  case Piece::attention: // LayerNorm 1, QKV, the projection
    layernorm_stats();
    if (fwd) {
      add("tp.a", Kind::all_gather, 1, X);
      add("tp.a", Kind::reduce_scatter, 1, X);
      add("tp.b", Kind::all_gather, 4, 4 * W);
      add("tp.c", Kind::all_gather, 1, X);
      add("tp.c", Kind::reduce_scatter, 3, 3 * X);
    } else {
      add("tp.a", Kind::all_gather, 2, 2 * X);
      add("tp.a", Kind::reduce_scatter, 1, X);
      add("tp.b", Kind::all_gather, 4, 4 * W);
      add("tp.b", Kind::reduce_scatter, 4, 4 * W, C);
      add("tp.c", Kind::all_gather, 4, 4 * X);
      add("tp.c", Kind::reduce_scatter, 1, X);
      add("tp.bc", Kind::all_reduce, 3, 3 * H / q, C); // bq, bk, bv
      add("tp.ab", Kind::all_reduce, 3, 3 * H / q, C); // bo, LayerNorm 1's gamma and beta
    }
    break;
  case Piece::mlp: // LayerNorm 2, W1, W2
    layernorm_stats();
    if (fwd) {
      add("tp.a", Kind::all_gather, 1, X);
      add("tp.a", Kind::reduce_scatter, 1, X);
      add("tp.b", Kind::all_gather, 2, 8 * W);
      add("tp.c", Kind::all_gather, 1, 4 * X);
      add("tp.c", Kind::reduce_scatter, 1, 4 * X);
    } else {
      add("tp.a", Kind::all_gather, 2, 2 * X);
      add("tp.a", Kind::reduce_scatter, 1, X);
      add("tp.b", Kind::all_gather, 2, 8 * W);
      add("tp.b", Kind::reduce_scatter, 2, 8 * W, C);
      add("tp.c", Kind::all_gather, 2, 8 * X);
      add("tp.c", Kind::reduce_scatter, 1, 4 * X);
      add("tp.bc", Kind::all_reduce, 1, 4 * H / q, C); // b1
      add("tp.ab", Kind::all_reduce, 3, 3 * H / q, C); // b2, LayerNorm 2's gamma and beta
    }
    break;
  case Piece::moe: // LayerNorm 2 and the rows' exchanges
    layernorm_stats();
    if (!fwd)
      add("tp.ab", Kind::all_reduce, 2, 2 * H / q, C);
    if (s.layout.tp > 1)
      add("tp.c", Kind::all_to_all, fwd ? 2 : 3, (fwd ? 2 : 3) * (q - 1) * X / q);
    break;
  case Piece::head: // ln_f; backward the loss (logits, their gradient), which runs there
    layernorm_stats();
    if (!fwd) {
      add("tp.a", Kind::all_gather, 1, X);
      add("tp.a", Kind::reduce_scatter, 1, X);
      add("tp.c", Kind::all_gather, 1, R * V / q);
      add("tp.c", Kind::reduce_scatter, 1, R * V / q);
      add("tp.a", Kind::all_reduce, 2, 3 * R, C);
      add("tp.bc", Kind::all_reduce, 1, 1, 8);         // the loss sum, a double
      add("tp.ab", Kind::all_reduce, 2, 2 * H / q, C); // ln_f's gamma and beta
    }
    break;
  case Piece::table:
    add("tp.b", fwd ? Kind::all_gather : Kind::reduce_scatter, 1, V * H / (q * q * q), fwd ? 0 : C);
    break;
  }
}

} // namespace cubelm::tp::detail
