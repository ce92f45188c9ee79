// The collectives of 2d tensor parallelism (SUMMA, mode_2d.cpp) per piece and pass, for
// tp/collectives.hpp. A q x q grid: "tp.row" holds the ranks of one grid row, "tp.col"
// those of one column; R = N / q rows of an activation block, H / q its features.
//
// A linear broadcasts, forward, its input's X blocks along the rows (q calls of R I / q
// elements for I input features) and each weight matrix's blocks along the columns (q
// calls of I O / q^2); backward it broadcasts both again and reduces the dX and dW blocks. Its
// bias and a LayerNorm's gamma and beta are gathered over the column forward and their
// gradients reduce-scattered backward (H / q^2 per vector); a LayerNorm sums its row
// statistics over the row group (2 calls forward, 1 backward, R each pair).
// Attention's linears (QKV and the projection: 2 H of inputs, 4 H^2 of weights, four
// bias vectors), the MLP's (W1, W2: 5 H, 8 H^2, b1 of 4 H and b2). The head broadcasts
// ln_f's output and the wte blocks, reduces their gradients, and sums the loss's
// statistics (3 R) and the loss (a double); the lookup reduce-scatters its rows' blocks
// (summed over the vocabulary's) and gathers their gradient. An MoE layer's rows are made whole
// over the row group and back: forward the input and the output, backward the input again, the
// output's gradient and the input's; each an [R, H / q] block of which (q - 1) / q goes to the
// other ranks.

#include "collectives_modes.hpp"

namespace cubelm::tp::detail {

void describe_2d(const Sizes& s, Piece piece, Pass pass, const Describe& add) {
  using comm::Kind;
  const bool fwd = pass == Pass::forward;
  const double H = s.H, V = s.V, q = s.q(), R = s.N / q;
  // A LayerNorm: its statistics summed over the row, its vectors over the column.
  // Forward weights travel as the model stores them, backward their gradients in the
  // compute type.
  const double vectors_bytes = fwd ? 0 : kComputeElement;
  const auto layernorm = [&] {
    add("tp.row", Kind::all_reduce, fwd ? 2 : 1, 2 * R, kComputeElement);
    add("tp.col", fwd ? Kind::all_gather : Kind::reduce_scatter, 2, 2 * H / (q * q), vectors_bytes);
  };
  // `count` linears with `inputs` input features in all, `matrices` weight matrices of
  // `weights` elements in all, and `biases` bias vectors of `vectors` elements in all.
  const auto linears = [&](double count, double inputs, double matrices, double weights,
                           double biases, double vectors) {
    add("tp.row", Kind::broadcast, count * q, R * inputs);
    add("tp.col", Kind::broadcast, matrices * q, weights / q);
    if (!fwd) {
      add("tp.row", Kind::reduce, count * q, R * inputs);
      add("tp.col", Kind::reduce, matrices * q, weights / q, kComputeElement);
    }
    add("tp.col", fwd ? Kind::all_gather : Kind::reduce_scatter, biases, vectors / (q * q),
        vectors_bytes);
  };
  switch (piece) {
  case Piece::lookup:
    add("tp.col", fwd ? Kind::reduce_scatter : Kind::all_gather, 1, R * H / q);
    break;
  case Piece::attention:
    layernorm();
    linears(2, 2 * H, 4, 4 * H * H, 4, 4 * H); // QKV, the projection
    break;
  case Piece::mlp:
    layernorm();
    linears(2, 5 * H, 2, 8 * H * H, 2, 5 * H); // W1, W2
    break;
  case Piece::moe:
    layernorm();
    if (s.layout.tp > 1)
      add("tp.row", Kind::all_to_all, fwd ? 2 : 3, (fwd ? 2 : 3) * (q - 1) * R * H / (q * q));
    break;
  case Piece::head: // ln_f; backward the loss (logits, their gradient), which runs there
    layernorm();
    if (!fwd) {
      add("tp.row", Kind::broadcast, q, R * V);
      add("tp.col", Kind::broadcast, 2 * q, 2 * V * H / q);
      add("tp.row", Kind::reduce, q, R * V);
      add("tp.col", Kind::reduce, q, V * H / q, kComputeElement);
      add("tp.row", Kind::all_reduce, 2, 3 * R, kComputeElement);
      add("tp.col", Kind::all_reduce, 1, 1, 8); // the loss sum, a double
    }
    break;
  case Piece::table:
    break;
  }
}

} // namespace cubelm::tp::detail
