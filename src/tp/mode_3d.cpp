// 3D cube tensor parallelism on a q x q x q grid (docs/tensor-parallel.md): Bian et
// al. 2021, "Maximizing Parallelism in Distributed Training for Huge Neural Networks",
// arXiv 2105.14450.
//
// Rank (a, b, c). A linear has a direction (in, w, out), a permutation of the
// axes: its input has rows split over (in, w) -- row block coord(w) q + coord(in)
// of q^2 -- and features over out; its weight block [in/q^2, out/q] holds
// input-feature chunk coord(out) q + coord(w) of q^2 and output-feature chunk
// coord(in) of q. Forward: all-gather X over in, W over w, multiply, and
// reduce-scatter the partial sums over out; the output's features are split over
// the old in axis, so the second linear of a pair runs in the swapped direction.
// Backward: all-gather dY over out, reduce-scatter dY W^T over in and X^T dY
// over w (X and W are gathered again rather than kept).
//
// The residual stream is the input of direction (A, B, C): rows block b q + a,
// features chunk c. Inside a pair (direction (C, B, A)) rows are block b q + c and
// features chunk a. LayerNorm statistics are all-reduced over the C axis.
// Vectors -- biases, LayerNorm gamma and beta -- hold the chunk of their features,
// replicated over the plane of the other two axes, with partial gradients
// all-reduced over that plane: they are O(H) against the O(H^2) weights, and
// replication keeps the layout rules at H % q (the paper's load-balanced
// storage needs H % q^3 or idle ranks).
//
// The tied embedding is a linear of direction (C, B, A) with a one-hot input:
// wte [V, H] is stored as its weight, [V/q^2, H/q] (vocabulary chunk a q + b of
// q^2, hidden chunk c). Forward: all-gather wte over B (kept until the head has
// used it), look up row block b of the micro-batch in vocabulary chunk a,
// reduce-scatter over A. The head logits = h wte^T is that linear's
// input-gradient pattern: all-gather h over A, multiply by the gathered wte^T,
// reduce-scatter over C: logits [N/q^2, V/q] for rows block b q + c and
// vocabulary chunk a, with the cross-entropy vocabulary-parallel over A. wpe
// holds hidden chunk c, replicated over the AB plane; its gradient, from row
// block b, is all-reduced over B.
//
// The paper's notation here. Its cube of P = p^3 processors is the q^3 tp ranks (its p
// is q here: cubelm's p is the 1D group size), its processor (i, j, k) rank (a, b, c),
// tp rank a + q (b + q c) (docs/grid.md). Its 3-D product C = A B is a linear's
// Y = X W, built from all-gathers and reduce-scatters along three directions of the
// cube: Direction's in (X gathered; the paper's input direction), w (W gathered) and
// out (Y reduce-scattered; the paper's output direction). The paper arranges the
// input and output directions over a Transformer's layers so that each output is
// already laid out as the next input; here first() and second() swap in and out. Its
// load-balanced storage of vectors is replaced by the replication described above.
//
// Glossary:
//   q                  cube side (tp = q^3).
//   Cube               q, the axis and plane groups and the workspace; cube_ in Mode3D
//                      and Embedding3D, cube in the constructors.
//   a, b, c            the axis groups A, B, C: the q ranks along one axis, ordered by it;
//                      a rank's coordinate on an axis is its rank there.
//   ab, bc, ca         the plane groups: q^2 ranks of equal c, a, b (ca serves no layer).
//   Direction          in, w, out: the axes of a linear as above; plane: the plane of w and
//                      out, over which its bias is replicated; coord(g) is the rank in g.
//   first(), second()  the directions of Role::first (A, B, C; plane BC) and Role::second
//                      (C, B, A; plane AB).
//   wr, wc             a weight block's rows and columns: in/q^2, out/q; row0, col0 its
//                      first row and column.
//   bv_, bh_           wte's vocabulary chunk as gathered over B, V/q (bv_/q rows held),
//                      and its hidden chunk, H/q.
//   per_, rows_        sequences per row block, batch/q^2; local rows, per_ * seq.
//   wte_gathered_      wte gathered over B; wte_grad_ its gradient in that shape (the
//                      head's and the lookup's when both are here), reduce-scattered over B.
//   lookup_            this Embedding has the lookup end (Ends::both or Ends::lookup).
//   Scratch            buffers shared by all layers (Workspace::scratch):
//     kInput             X gathered over in; h or dX gathered over A in the embedding;
//     kWeight            W gathered over w;
//     kOutput            Y's partial sums before the reduce-scatter over out, or dY
//                        gathered over out; the lookup's and the head's partial sums, and
//                        dlogits gathered over C;
//     kInputGrad         dY W^T before the reduce-scatter over in; dh before the one
//                        over A in the head;
//     kWeightGrad        X^T dY before the reduce-scatter over w;
//     kWeightBlock       the block a weight gradient (kWeightGrad, or wte_grad_) is
//                        reduce-scattered to, then added to the parameter's gradient.

#include "buffer_names.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "modes.hpp"
#include "parts.hpp"

#include <string>

namespace cubelm::tp::detail {

namespace {

// Scratch buffers: d3:: (buffer_names.hpp; their sizes: tp/buffers.hpp, reserved by Mode3D).

struct Direction {
  const comm::Group* in;
  const comm::Group* w;
  const comm::Group* out;
  const comm::Group* plane; // the plane of w and out: where the outputs' vectors are replicated
};

template <class T>
struct Cube {
  int q;
  const comm::Group *a, *b, *c;    // the axes
  const comm::Group *ab, *bc, *ca; // the planes
  Workspace<T>& ws;

  Direction first() const { return {a, b, c, bc}; }
  Direction second() const { return {c, b, a, ab}; }
};

template <class T>
void add_to(const ExecSpace& exec, const Mat<T>& sum, const Mat<T>& target) {
  kernels::add_inplace<T>(exec, target, sum);
}

template <class T>
class Linear3D final : public Linear<T> {
public:
  using G = compute_t<T>;
  Linear3D(const Cube<T>& cube, Direction d, Params<T>& params,
           const std::vector<std::string>& weights, const std::vector<std::string>& biases,
           std::int64_t in, std::int64_t out, double std_dev, std::uint64_t seed)
      : ws_(cube.ws), d_(d), q_(cube.q) {
    check_names(weights, biases);
    const std::int64_t q = cube.q;
    const std::int64_t wr = in / (q * q), wc = out / q;
    const std::int64_t row0 = (d.out->rank() * q + d.w->rank()) * wr, col0 = d.in->rank() * wc;
    for (std::size_t n = 0; n < weights.size(); ++n) {
      w_.push_back(Shared<T>::owned(
          params, make_param<T>(weights[n], {in, out}, {row0, col0}, {wr, wc}, std_dev, 0, seed)));
      b_.push_back(Shared<T>::replicated(params,
                                         make_param<T>(biases[n], {out}, {col0}, {wc}, 0, 0, seed),
                                         *d.plane, d.plane, cube.ws));
    }
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& y) override {
    const Mat<T> xg = gather_input(exec, x);
    for (std::size_t n = 0; n < w_.size(); ++n) {
      const Mat<T> part = ws_.scratch(d3::kOutput, xg.extent(0), y[n].extent(1));
      kernels::gemm<T>(exec, false, false, T(1), xg, gather_weight(exec, n), T(0), part);
      d_.out->reduce_scatter(exec, part, y[n]);
      kernels::bias_add<T>(exec, y[n], b_[n].values());
    }
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& dy,
                const Mat<T>& dx) override {
    const Mat<T> xg = gather_input(exec, x);
    const Mat<T> dxg = ws_.scratch(d3::kInputGrad, xg.extent(0), xg.extent(1));
    for (std::size_t n = 0; n < w_.size(); ++n) {
      const Mat<T> dyg = ws_.scratch(d3::kOutput, xg.extent(0), dy[n].extent(1));
      d_.out->all_gather(exec, dy[n], dyg);
      kernels::gemm<T>(exec, false, true, T(1), dyg, gather_weight(exec, n), n == 0 ? T(0) : T(1),
                       dxg);
      const Mat<G> dw = ws_.compute_scratch(d3::kWeightGrad, xg.extent(1), dy[n].extent(1));
      kernels::gemm<T>(exec, true, false, T(1), xg, dyg, T(0), dw);
      const Mat<G> block = ws_.compute_scratch(d3::kWeightBlock, dw.extent(0) / q_, dw.extent(1));
      d_.w->reduce_scatter(exec, dw, block);
      add_to<G>(exec, block, w_[n].param().grad_mat());
      kernels::bias_backward<T>(exec, dy[n], b_[n].grad(exec));
      b_[n].reduce(exec);
    }
    d_.in->reduce_scatter(exec, dxg, dx);
  }

private:
  Mat<T> gather_input(const ExecSpace& exec, const Mat<T>& x) {
    const Mat<T> xg = ws_.scratch(d3::kInput, x.extent(0) * q_, x.extent(1));
    d_.in->all_gather(exec, x, xg);
    return xg;
  }
  Mat<T> gather_weight(const ExecSpace& exec, std::size_t n) {
    const Mat<T> w = w_[n].param().mat();
    const Mat<T> wg = ws_.scratch(d3::kWeight, w.extent(0) * q_, w.extent(1));
    d_.w->all_gather(exec, w, wg);
    return wg;
  }

  Workspace<T>& ws_;
  Direction d_;
  int q_;
  std::vector<Shared<T>> w_, b_;
};

template <class T>
class Embedding3D final : public Embedding<T> {
public:
  using G = compute_t<T>;
  Embedding3D(const Cube<T>& cube, Params<T>& params, int vocab, int padded, kernels::Positions pos,
              std::int64_t hidden, int batch, std::uint64_t seed, Ends ends)
      : cube_(cube), pos_(pos), seq_(pos.local), per_(batch / (cube.q * cube.q)),
        bv_(padded / cube.q), bh_(hidden / cube.q),
        rows_(static_cast<std::int64_t>(per_) * pos.local), lookup_(ends != Ends::head),
        wte_(Shared<T>::owned(
            params, make_param<T>("wte", {padded, hidden},
                                  {(cube.a->rank() * cube.q + cube.b->rank()) * (bv_ / cube.q),
                                   cube.c->rank() * bh_},
                                  {bv_ / cube.q, bh_}, 0.02, 0, seed, vocab))),
        wte_gathered_(cube.ws.matrix(own::kWteGathered, bv_, bh_)),
        wte_grad_(cube.ws.compute_matrix(own::kWteGrad, bv_, bh_)) {
    const std::int64_t q = cube.q;
    Kokkos::deep_copy(wte_grad_, G(0));
    if (lookup_) {
      ends_.lookup(params, pos.total(), hidden, cube.c->rank() * bh_, bh_, seed, *cube.ab, cube.b,
                   rows_ * q, cube.ws);
    }
    if (ends != Ends::lookup) {
      ends_.head(cube.a, cube.bc, rows_, bv_, vocab, cube.ws);
    }
  }

  void forward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
               const Mat<T>& x) override {
    const int q = cube_.q, first = static_cast<int>(cube_.a->rank() * bv_);
    // Row block b of q: the sequences whose rows this rank's A axis shares. The
    // gathered wte stays for the head (parameters change only between steps).
    const Tokens& ids = ends_.tokens->set(exec, mine(tokens));
    cube_.b->all_gather(exec, wte_.param().mat(), wte_gathered_);
    const Mat<T> part = cube_.ws.scratch(d3::kOutput, rows_ * q, bh_);
    kernels::embedding_lookup<T>(exec, ids, wte_gathered_, first, part);
    cube_.a->reduce_scatter(exec, part, x);
    kernels::position_add<T>(exec, ends_.wpe->param().mat(), pos_, x);
  }

  void backward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
                const Mat<T>& dx) override {
    // The forward's device tokens may belong to a later micro-batch by now: set them again.
    const auto& index =
        ends_.index.build(exec, ends_.tokens->set(exec, mine(tokens)),
                          static_cast<int>(cube_.a->rank() * bv_), static_cast<int>(bv_));
    const Mat<T> all = cube_.ws.scratch(d3::kInput, rows_ * cube_.q, bh_);
    cube_.a->all_gather(exec, dx, all);
    // wte_grad_ may hold the head's share too (loss() adds to it and runs first).
    kernels::token_backward<T>(exec, index, all, wte_grad_);
    reduce_wte_grad(exec);
    kernels::position_backward<T>(exec, all, pos_, ends_.wpe->grad_mat(exec));
    ends_.wpe->reduce(exec);
  }

  double loss(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& targets,
              compute_t<T> grad_scale, const Mat<T>& dh) override {
    const int q = cube_.q;
    const Mat<T> hg = cube_.ws.scratch(d3::kInput, rows_ * q, bh_);
    const Mat<T>& logits = head(exec, h, hg);
    const double sum = (*ends_.loss)(exec, logits, static_cast<int>(cube_.a->rank() * bv_),
                                     rows_here(targets), grad_scale);
    if (grad_scale == compute_t<T>(0))
      return sum;
    const Mat<T> dl = cube_.ws.scratch(d3::kOutput, rows_ * q, bv_);
    cube_.c->all_gather(exec, logits, dl);
    const Mat<T> dhg = cube_.ws.scratch(d3::kInputGrad, rows_ * q, bh_);
    kernels::gemm<T>(exec, false, false, T(1), dl, wte_gathered_, T(0), dhg);
    cube_.a->reduce_scatter(exec, dhg, dh);
    kernels::gemm<T>(exec, true, false, T(1), dl, hg, T(1), wte_grad_);
    // With a lookup here, the lookup's backward (after every loss of the step) reduces it.
    if (!lookup_)
      reduce_wte_grad(exec);
    return sum;
  }

  void logits(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& marks,
              const Vec<float>& out) override {
    const Mat<T> hg = cube_.ws.scratch(d3::kInput, rows_ * cube_.q, bh_);
    ends_.loss->capture(exec, head(exec, h, hg), static_cast<int>(cube_.a->rank() * bv_),
                        rows_here(marks), out);
  }

private:
  // This rank's block of the logits (hg: h gathered over A, kept for the backward).
  const Mat<T>& head(const ExecSpace& exec, const Mat<T>& h, const Mat<T>& hg) {
    if (!lookup_) // no forward here has gathered wte
      cube_.b->all_gather(exec, wte_.param().mat(), wte_gathered_);
    cube_.a->all_gather(exec, h, hg);
    const Mat<T> part = cube_.ws.scratch(d3::kOutput, rows_ * cube_.q, bv_);
    kernels::gemm<T>(exec, false, true, T(1), hg, wte_gathered_, T(0), part);
    cube_.c->reduce_scatter(exec, part, ends_.logits);
    return ends_.logits;
  }
  // The sequences of the micro-batch's ids (targets or marks) whose logits rows are here.
  std::vector<std::int32_t> rows_here(const std::vector<std::int32_t>& ids) const {
    const int block = cube_.b->rank() * cube_.q + cube_.c->rank();
    return sequences(ids, seq_, block * per_, per_);
  }
  // Row block b of q of the micro-batch's token ids.
  std::vector<std::int32_t> mine(const std::vector<std::int32_t>& tokens) const {
    return sequences(tokens, seq_, cube_.b->rank() * per_ * cube_.q, per_ * cube_.q);
  }
  // The gathered-shape wte gradient, reduce-scattered over B into this rank's block.
  void reduce_wte_grad(const ExecSpace& exec) {
    const Mat<G> block = cube_.ws.compute_scratch(d3::kWeightBlock, bv_ / cube_.q, bh_);
    cube_.b->reduce_scatter(exec, wte_grad_, block);
    add_to<G>(exec, block, wte_.param().grad_mat());
    Kokkos::deep_copy(exec, wte_grad_, G(0));
  }

  Cube<T> cube_;
  kernels::Positions pos_;
  int seq_, per_; // seq_: the tokens of a sequence here
  std::int64_t bv_, bh_, rows_;
  bool lookup_;
  Shared<T> wte_;
  Mat<T> wte_gathered_;
  Mat<G> wte_grad_;
  EmbeddingEnds<T> ends_;
};

template <class T>
class Mode3D final : public ModeBase<T> {
public:
  explicit Mode3D(const comm::ProcessGrid& grid)
      : ModeBase<T>(grid), cube_{
                               grid.tp_axis(comm::Axis::a).size(), &grid.tp_axis(comm::Axis::a),
                               &grid.tp_axis(comm::Axis::b),       &grid.tp_axis(comm::Axis::c),
                               &grid.tp_plane(comm::Plane::ab),    &grid.tp_plane(comm::Plane::bc),
                               &grid.tp_plane(comm::Plane::ca),    ws_} {}
  const char* name() const override { return "3d"; }

  std::unique_ptr<Linear<T>> linear(Params<T>& params, const std::vector<std::string>& weights,
                                    const std::vector<std::string>& biases, std::int64_t in,
                                    std::int64_t out, std::int64_t rows, Role role, double std_dev,
                                    std::uint64_t seed) override {
    const Direction d = role == Role::first ? cube_.first() : cube_.second();
    ws_.reserve_all(linear_scratch(this->layout(), in, out, rows, role == Role::second));
    return std::make_unique<Linear3D<T>>(cube_, d, params, weights, biases, in, out, std_dev, seed);
  }
  std::unique_ptr<LayerNorm<T>> layernorm(Params<T>& params, const std::string& prefix,
                                          std::int64_t features, std::int64_t rows) override {
    const std::int64_t block = features / cube_.q, first = cube_.c->rank() * block;
    auto vec = [&](const char* what, double fill) {
      return Shared<T>::replicated(
          params, make_param<T>(prefix + what, {features}, {first}, {block}, 0, fill, 0), *cube_.ab,
          cube_.ab, ws_);
    };
    // beta is registered before gamma, explicitly: the order of the parameters (and
    // so of the gradient buffers) is not left to the order arguments are evaluated in.
    auto beta = vec("/beta", 0);
    auto gamma = vec("/gamma", 1);
    return std::make_unique<SplitLayerNorm<T>>(std::move(gamma), std::move(beta), cube_.c, features,
                                               rows, ws_);
  }
  std::unique_ptr<Embedding<T>> embedding(Params<T>& params, int vocab, int padded,
                                          kernels::Positions pos, std::int64_t hidden, int batch,
                                          std::uint64_t seed, Ends ends) override {
    ws_.reserve_all(embedding_scratch(this->layout(), ends != Ends::head, ends != Ends::lookup,
                                      batch, pos.local, hidden, padded));
    return std::make_unique<Embedding3D<T>>(cube_, params, vocab, padded, pos, hidden, batch, seed,
                                            ends);
  }

  std::unique_ptr<MoE<T>> moe(Params<T>& params, const MoeNames& names, const MoeShape& shape,
                              std::int64_t hidden, std::int64_t rows, double std_dev,
                              double proj_std, std::uint64_t seed) override {
    // Each rank routes a share of its rows, made whole over the C axis (the ranks holding
    // the other features of its rows); the experts' group spans the tensor ranks
    // (docs/grid.md#expert-parallelism).
    MoePlacement placement = this->moe_placement();
    placement.features = cube_.c;
    return make_moe<T>(params, ws_, names, shape, {hidden, rows, std_dev, proj_std, seed},
                       placement);
  }

private:
  using ModeBase<T>::ws_;
  Cube<T> cube_;
};

} // namespace

template <class T>
std::unique_ptr<Mode<T>> make_3d(const comm::ProcessGrid& grid) {
  return std::make_unique<Mode3D<T>>(grid);
}

template std::unique_ptr<Mode<float>> make_3d<float>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<double>> make_3d<double>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<bf16>> make_3d<bf16>(const comm::ProcessGrid&);

} // namespace cubelm::tp::detail
