// The collectives of the tensor-parallel modes (tp/collectives.hpp): the groups, the
// dispatch to each mode's description, and the part of an MoE feed-forward that every
// mode shares (moe_router.hpp, moe_shares.hpp).

#include "cubelm/tp/collectives.hpp"

#include "cubelm/tp/shapes.hpp"

#include "collectives_modes.hpp"

namespace cubelm::tp {

namespace {

using comm::Kind;

// An MoE feed-forward under tensor parallelism (no collectives on one rank), each rank
// routing a share of N / p of the tokens. It routes them: the load fractions (E) are
// summed over the group each forward, the router's gradient (H E) each backward. Or with
// expert tensor parallelism the shares are all-gathered (forward; backward again with the
// output's gradient), the partial outputs and input gradients reduce-scattered, and the
// gates' gradient (N k) summed over the group; under 1d without sequence parallelism the
// tokens are replicated already, and the partial outputs and input gradients (N H) are
// all-reduced instead. The mode adds how its rows reach the share (describe_*).
void describe_moe(const detail::Sizes& s, Pass pass, const detail::Describe& add) {
  const comm::Layout& l = s.layout;
  if (l.tp == 1)
    return;
  const bool fwd = pass == Pass::forward;
  if (l.etp == 1) {
    add("tp", Kind::all_reduce, 1, fwd ? s.E : s.H * s.E, kComputeElement);
    return;
  }
  const bool replicated =
      (l.mode == TensorMode::none || l.mode == TensorMode::d1) && !l.sequence_parallel;
  if (replicated) {
    add("tp", Kind::all_reduce, 1, s.N * s.H);
  } else {
    const double share = s.N * s.H / s.p();
    add("tp", Kind::all_gather, fwd ? 1 : 2, (fwd ? 1 : 2) * share);
    add("tp", Kind::reduce_scatter, 1, share);
  }
  if (!fwd) // the gates' gradient
    add("tp", Kind::all_reduce, 1, s.N * s.k, kComputeElement);
}

} // namespace

std::vector<std::pair<std::string, int>> collective_groups(const comm::Layout& layout) {
  std::vector<std::pair<std::string, int>> g = {{"tp", layout.tp}};
  const int q = layout.side();
  if (layout.mode == TensorMode::d2) {
    g.emplace_back("tp.row", q);
    g.emplace_back("tp.col", q);
  } else if (layout.mode == TensorMode::d3) {
    for (const char* axis : {"tp.a", "tp.b", "tp.c"})
      g.emplace_back(axis, q);
    for (const char* plane : {"tp.ab", "tp.bc", "tp.ca"})
      g.emplace_back(plane, q * q);
  }
  return g;
}

std::vector<Collective> collectives(const comm::Layout& layout, const ModelConfig& model,
                                    double tokens, Piece piece, Pass pass) {
  const detail::Sizes s{layout,
                        tokens,
                        static_cast<double>(model.hidden),
                        static_cast<double>(padded_vocab(model, layout)),
                        static_cast<double>(model.seq_len),
                        static_cast<double>(model.experts),
                        static_cast<double>(model.top_k)};
  std::vector<Collective> out;
  const detail::Describe add(out);
  if (piece == Piece::moe)
    describe_moe(s, pass, add);
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    detail::describe_1d(s, piece, pass, add);
    break;
  case TensorMode::d2:
    detail::describe_2d(s, piece, pass, add);
    break;
  case TensorMode::d3:
    detail::describe_3d(s, piece, pass, add);
    break;
  }
  return out;
}

} // namespace cubelm::tp
