// 2D tensor parallelism on a q x q grid (docs/tensor-parallel.md): Optimus, Xu et al.
// 2021, "An Efficient 2D Method for Training Super-Large Deep Learning Models",
// arXiv 2104.05343, whose matrix products are SUMMA, van de Geijn & Watts 1997,
// "SUMMA: Scalable Universal Matrix Multiplication Algorithm".
//
// Rank (i, j) holds block (i, j) of every activation (rows: sequence block i of
// q, columns: feature block j of q) and of every weight (input-feature block i,
// output-feature block j). A linear is SUMMA: for k = 0..q-1 broadcast X_ik
// along row i and W_kj along column j and accumulate. Its backward pass
// broadcasts the same blocks and reduces the partial products: dX_ik along row i
// to column k, dW_kj along column j to row k. Vectors (biases, LayerNorm gamma
// and beta, length n) hold block j of n/q split again over the q rows: n/q^2 per
// rank, all-gathered over the column forward, reduce-scattered backward.
// LayerNorm row statistics are all-reduced over the row.
//
// The tied embedding: wte [V, H] is stored like a weight [V, H] (vocabulary block
// i, hidden block j). The lookup is a product onehot(tokens) x wte: every rank of
// column j looks up all rows of the micro-batch in its vocabulary block and a
// reduce-scatter over the column leaves each rank its row block. The head
// logits = h wte^T is SUMMA with a transposed operand: broadcast wte block (m, j)
// along column j, multiply, reduce along row i to column m; the cross-entropy is
// vocabulary-parallel over the row. wpe [T, H] holds hidden block j, replicated
// over the column (its gradient comes from the gathered full-row dx, so it is
// the same on every rank of the column).
//
// The papers' notation here. SUMMA computes C = A B on a mesh as C_ij = sum_k A_ik B_kj:
// at step k, A_ik is broadcast along mesh row i and B_kj along mesh column j. A linear
// is that product with A, B, C = X, W, Y, and k is the step of Linear2D's loops. The
// backward products dX = dY W^T and dW = X^T dY are SUMMA's A B^T and A^T B forms:
// one operand is broadcast and the local product is reduced to the step's column
// (along the row) or row (along the column). The head logits = h wte^T is A B^T again,
// its step named m (the vocabulary block). Optimus's mesh of q^2 devices is the grid,
// device (i, j) being tp rank i q + j (docs/grid.md), and its activations [b, s, h],
// cut into blocks [b/q, s, h/q], are those here: whole sequences over i, features over j.
//
// Glossary:
//   q, i, j         grid side (tp = q^2); this rank's row and column.
//   Grid2D          q, i, j, the row and column groups and the workspace, with the two
//                   collectives of a SUMMA step; grid_ in Mode2D, g and g_ in the layers.
//   row, col        the ranks of row i (ordered by j); of column j (ordered by i).
//   broadcast       a block from group rank k to the group (the owner's own view on it).
//   reduce_add      a partial product summed on group rank k and added to a gradient there.
//   bi, bo          a linear's input- and output-feature block: in/q, out/q.
//   bv_, bh_        wte's vocabulary and hidden block: V/q, H/q.
//   rows_, per      local rows of the head, per * seq; sequences per row block, batch/q.
//   Scratch         buffers shared by all layers (Workspace::scratch):
//     kAct            a broadcast activation block: X_ik, or dlogits_im in the head;
//     kWeight         a broadcast weight block: W_kj, or wte block (m, j);
//     kPartial        a partial product shaped like an activation (dY W^T before the row
//                     reduce, partial logits), or all rows of the micro-batch in the lookup
//                     (looked up, or dX gathered over the column);
//     kWeightPartial  a partial product shaped like a weight block: X^T dY, dlogits^T h;
//     kWeightSum      its sum on the rank it is reduced to (Grid2D::reduce_add).

#include "buffer_names.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "modes.hpp"
#include "parts.hpp"

#include <string>

namespace cubelm::tp::detail {

namespace {

// Scratch buffers: d2:: (buffer_names.hpp; their sizes: tp/buffers.hpp, reserved by Mode2D).

template <class T>
struct Grid2D {
  const comm::Group& row; // fixed i, ranks ordered by j
  const comm::Group& col; // fixed j, ranks ordered by i
  int q, i, j;
  Workspace<T>& ws;

  // Block `own` of group rank k, broadcast over `g`: this rank's own view if it is k.
  Mat<T> broadcast(const ExecSpace& exec, const comm::Group& g, const Mat<T>& own, int k,
                   ScratchName which) const {
    const Mat<T> buf = g.rank() == k ? own : ws.scratch(which, own.extent(0), own.extent(1));
    g.broadcast(exec, buf, k);
    return buf;
  }
  // Sums the weight gradient `partial` over `g` on group rank k and adds the sum to
  // `target` there.
  void reduce_add(const ExecSpace& exec, const comm::Group& g, const Mat<compute_t<T>>& partial,
                  int k, const Mat<compute_t<T>>& target) const {
    const Mat<compute_t<T>> sum =
        ws.compute_scratch(d2::kWeightSum, partial.extent(0), partial.extent(1));
    g.reduce(exec, partial, sum, k);
    if (g.rank() == k)
      kernels::add_inplace<compute_t<T>>(exec, target, sum);
  }
};

template <class T>
class Linear2D final : public Linear<T> {
public:
  Linear2D(const Grid2D<T>& g, Params<T>& params, const std::vector<std::string>& weights,
           const std::vector<std::string>& biases, std::int64_t in, std::int64_t out,
           double std_dev, std::uint64_t seed)
      : g_(g) {
    check_names(weights, biases);
    const std::int64_t bi = in / g.q, bo = out / g.q;
    for (std::size_t n = 0; n < weights.size(); ++n) {
      w_.push_back(
          Shared<T>::owned(params, make_param<T>(weights[n], {in, out}, {g.i * bi, g.j * bo},
                                                 {bi, bo}, std_dev, 0, seed)));
      b_.push_back(Shared<T>::split(params, biases[n], out, g.j * bo, bo, 0, seed, g.col, g.ws));
    }
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& y) override {
    for (int k = 0; k < g_.q; ++k) {
      const Mat<T> xk = g_.broadcast(exec, g_.row, x, k, d2::kAct); // X_ik
      for (std::size_t n = 0; n < w_.size(); ++n) {
        const Mat<T> wk = g_.broadcast(exec, g_.col, w_[n].param().mat(), k, d2::kWeight); // W_kj
        kernels::gemm<T>(exec, false, false, T(1), xk, wk, k == 0 ? T(0) : T(1), y[n]);
      }
    }
    for (std::size_t n = 0; n < w_.size(); ++n)
      kernels::bias_add<T>(exec, y[n], b_[n].gather(exec));
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& dy,
                const Mat<T>& dx) override {
    for (int k = 0; k < g_.q; ++k) {
      // dX_ik = sum_j dY_ij W_kj^T, reduced along the row to column k.
      const Mat<T> part = g_.ws.scratch(d2::kPartial, x.extent(0), x.extent(1));
      for (std::size_t n = 0; n < w_.size(); ++n) {
        const Mat<T> wk = g_.broadcast(exec, g_.col, w_[n].param().mat(), k, d2::kWeight);
        kernels::gemm<T>(exec, false, true, T(1), dy[n], wk, n == 0 ? T(0) : T(1), part);
      }
      g_.row.reduce(exec, part, dx, k);
      // dW_kj = sum_i X_ik^T dY_ij, reduced along the column to row k.
      const Mat<T> xk = g_.broadcast(exec, g_.row, x, k, d2::kAct);
      for (std::size_t n = 0; n < w_.size(); ++n) {
        const Mat<compute_t<T>> dw =
            g_.ws.compute_scratch(d2::kWeightPartial, xk.extent(1), dy[n].extent(1));
        kernels::gemm<T>(exec, true, false, T(1), xk, dy[n], T(0), dw);
        g_.reduce_add(exec, g_.col, dw, k, w_[n].param().grad_mat());
      }
    }
    for (std::size_t n = 0; n < w_.size(); ++n) {
      kernels::bias_backward<T>(exec, dy[n], b_[n].grad(exec));
      b_[n].reduce(exec);
    }
  }

private:
  Grid2D<T> g_;
  std::vector<Shared<T>> w_, b_;
};

template <class T>
class Embedding2D final : public Embedding<T> {
public:
  Embedding2D(const Grid2D<T>& g, Params<T>& params, int vocab, int padded, kernels::Positions pos,
              std::int64_t hidden, int batch, std::uint64_t seed, Ends ends)
      : g_(g), pos_(pos), seq_(pos.local), batch_(batch), bv_(padded / g.q), bh_(hidden / g.q),
        rows_(static_cast<std::int64_t>(batch / g.q) * pos.local),
        wte_(Shared<T>::owned(params, make_param<T>("wte", {padded, hidden}, {g.i * bv_, g.j * bh_},
                                                    {bv_, bh_}, 0.02, 0, seed, vocab))) {
    const std::int64_t all = static_cast<std::int64_t>(batch) * pos.local;
    if (ends != Ends::head) {
      ends_.lookup(params, pos.total(), hidden, g.j * bh_, bh_, seed, g.col, nullptr, all, g.ws);
    }
    if (ends != Ends::lookup) {
      ends_.head(&g.row, &g.col, rows_, bv_, vocab, g.ws);
    }
  }

  void forward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
               const Mat<T>& x) override {
    const int first = static_cast<int>(g_.i * bv_);
    const Tokens& ids = ends_.tokens->set(exec, tokens);
    // Every row of the micro-batch looked up in vocabulary block i; summing over the
    // column completes the rows, and each rank keeps its row block.
    const Mat<T> part = g_.ws.scratch(d2::kPartial, ids.extent(0), bh_);
    kernels::embedding_lookup<T>(exec, ids, wte_.param().mat(), first, part);
    g_.col.reduce_scatter(exec, part, x);
    kernels::position_add<T>(exec, ends_.wpe->param().mat(), pos_, x);
  }

  void backward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
                const Mat<T>& dx) override {
    // The forward's device tokens may belong to a later micro-batch by now: set them again.
    const auto& index = ends_.index.build(exec, ends_.tokens->set(exec, tokens),
                                          static_cast<int>(g_.i * bv_), static_cast<int>(bv_));
    const Mat<T> all = g_.ws.scratch(d2::kPartial, static_cast<std::int64_t>(tokens.size()), bh_);
    g_.col.all_gather(exec, dx, all);
    kernels::token_backward<T>(exec, index, all, wte_.param().grad_mat());
    kernels::position_backward<T>(exec, all, pos_, ends_.wpe->param().grad_mat());
  }

  double loss(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& targets,
              compute_t<T> grad_scale, const Mat<T>& dh) override {
    const Mat<T>& logits = head(exec, h);
    const double sum =
        (*ends_.loss)(exec, logits, static_cast<int>(g_.j * bv_), rows_here(targets), grad_scale);
    if (grad_scale == compute_t<T>(0))
      return sum;
    // dh_ik = sum_m dlogits_im wte_mk; dwte_mk = sum_i dlogits_im^T h_ik.
    for (int m = 0; m < g_.q; ++m) {
      const Mat<T> dm = g_.broadcast(exec, g_.row, logits, m, d2::kAct);
      const Mat<T> wm = g_.broadcast(exec, g_.col, wte_.param().mat(), m, d2::kWeight);
      kernels::gemm<T>(exec, false, false, T(1), dm, wm, m == 0 ? T(0) : T(1), dh);
      const Mat<compute_t<T>> dw = g_.ws.compute_scratch(d2::kWeightPartial, bv_, bh_);
      kernels::gemm<T>(exec, true, false, T(1), dm, h, T(0), dw);
      g_.reduce_add(exec, g_.col, dw, m, wte_.param().grad_mat());
    }
    return sum;
  }

  void logits(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& marks,
              const Vec<float>& out) override {
    ends_.loss->capture(exec, head(exec, h), static_cast<int>(g_.j * bv_), rows_here(marks), out);
  }

private:
  // logits_im = sum_k h_ik wte_mk^T: reduced along row i to column m.
  const Mat<T>& head(const ExecSpace& exec, const Mat<T>& h) {
    for (int m = 0; m < g_.q; ++m) {
      const Mat<T> wm = g_.broadcast(exec, g_.col, wte_.param().mat(), m, d2::kWeight);
      const Mat<T> part = g_.ws.scratch(d2::kPartial, rows_, bv_);
      kernels::gemm<T>(exec, false, true, T(1), h, wm, T(0), part);
      g_.row.reduce(exec, part, ends_.logits, m);
    }
    return ends_.logits;
  }
  // The sequences of the micro-batch's ids (targets or marks) whose rows are here.
  std::vector<std::int32_t> rows_here(const std::vector<std::int32_t>& ids) const {
    const int per = batch_ / g_.q;
    return sequences(ids, seq_, g_.i * per, per);
  }

  Grid2D<T> g_;
  kernels::Positions pos_;
  int seq_, batch_; // seq_: the tokens of a sequence here
  std::int64_t bv_, bh_, rows_;
  Shared<T> wte_;
  EmbeddingEnds<T> ends_;
};

template <class T>
class Mode2D final : public ModeBase<T> {
public:
  explicit Mode2D(const comm::ProcessGrid& grid)
      : ModeBase<T>(grid), grid_{grid.tp_row(),        grid.tp_col(),        grid.tp_row().size(),
                                 grid.tp_col().rank(), grid.tp_row().rank(), ws_} {}
  const char* name() const override { return "2d"; }

  std::unique_ptr<Linear<T>> linear(Params<T>& params, const std::vector<std::string>& weights,
                                    const std::vector<std::string>& biases, std::int64_t in,
                                    std::int64_t out, std::int64_t rows, Role /*role*/,
                                    double std_dev, std::uint64_t seed) override {
    ws_.reserve_all(linear_scratch(this->layout(), in, out, rows, false));
    return std::make_unique<Linear2D<T>>(grid_, params, weights, biases, in, out, std_dev, seed);
  }
  std::unique_ptr<LayerNorm<T>> layernorm(Params<T>& params, const std::string& prefix,
                                          std::int64_t features, std::int64_t rows) override {
    const std::int64_t block = features / grid_.q;
    auto vec = [&](const char* what, double fill) {
      return Shared<T>::split(params, prefix + what, features, grid_.j * block, block, fill, 0,
                              grid_.col, ws_);
    };
    // beta is registered before gamma, explicitly: the order of the parameters (and
    // so of the gradient buffers) is not left to the order arguments are evaluated in.
    auto beta = vec("/beta", 0);
    auto gamma = vec("/gamma", 1);
    return std::make_unique<SplitLayerNorm<T>>(std::move(gamma), std::move(beta), &grid_.row,
                                               features, rows, ws_);
  }
  std::unique_ptr<Embedding<T>> embedding(Params<T>& params, int vocab, int padded,
                                          kernels::Positions pos, std::int64_t hidden, int batch,
                                          std::uint64_t seed, Ends ends) override {
    ws_.reserve_all(embedding_scratch(this->layout(), ends != Ends::head, ends != Ends::lookup,
                                      batch, pos.local, hidden, padded));
    return std::make_unique<Embedding2D<T>>(grid_, params, vocab, padded, pos, hidden, batch, seed,
                                            ends);
  }

  std::unique_ptr<MoE<T>> moe(Params<T>& params, const MoeNames& names, const MoeShape& shape,
                              std::int64_t hidden, std::int64_t rows, double std_dev,
                              double proj_std, std::uint64_t seed) override {
    // Each rank routes a share of its rows, made whole over the row group (the ranks holding
    // the other features of its rows); the experts' group spans the tensor ranks
    // (docs/grid.md#expert-parallelism).
    MoePlacement placement = this->moe_placement();
    placement.features = &grid_.row;
    return make_moe<T>(params, ws_, names, shape, {hidden, rows, std_dev, proj_std, seed},
                       placement);
  }

private:
  using ModeBase<T>::ws_;
  Grid2D<T> grid_;
};

} // namespace

template <class T>
std::unique_ptr<Mode<T>> make_2d(const comm::ProcessGrid& grid) {
  return std::make_unique<Mode2D<T>>(grid);
}

template std::unique_ptr<Mode<float>> make_2d<float>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<double>> make_2d<double>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<bf16>> make_2d<bf16>(const comm::ProcessGrid&);

} // namespace cubelm::tp::detail
