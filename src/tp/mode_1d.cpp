// Megatron-style 1D tensor parallelism over the tp group (docs/tensor-parallel.md). With one
// rank in the group it is the single-process model ("none").
//
// The residual stream is replicated on the p ranks. Role::first linears are
// column-parallel (W[:, out/p], forward local, backward all-reduce of dx),
// Role::second linears row-parallel (W[in/p, :], forward all-reduce, bias added
// once after it). The token embedding and the tied head are vocabulary-parallel
// (wte rows split); LayerNorm, wpe and the row-parallel biases are replicated and
// written to checkpoints by tp rank 0 only.
//
// With sequence parallelism (Megatron-Core's) the residual stream is split over
// the ranks along its rows (rank r holds rows [r N/p, (r+1) N/p) of the N tokens),
// and each all-reduce becomes a reduce-scatter and an all-gather of the same bytes:
// a LayerNorm normalises its own rows and all-gathers its output (the input of a
// pair's first linear), and in backward reduce-scatters the partial gradient the
// first linear hands back (which skips its all-reduce); a row-parallel linear
// reduce-scatters its partial output instead of all-reducing it, and all-gathers
// its output gradient in backward. The lookup reduce-scatters its partial rows,
// the head reads ln_f's gathered output. LayerNorm parameters and the row-parallel
// biases see only their rank's rows: their gradients are all-reduced over the group.

#include "buffer_names.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "modes.hpp"
#include "parts.hpp"

#include <string>

namespace cubelm::tp::detail {

namespace {

// Scratch buffers of the mode under sequence parallelism (buffer_names.hpp; their sizes:
// tp/buffers.hpp, reserved by Mode1D).
using d1::kFull;
using d1::kLocal;

// The sequence-parallel split of the residual stream: `rows` tokens, blocks of rows / p.
struct SeqSplit {
  bool on = false;
  std::int64_t rows = 0; // N: tokens of the micro-batch
  std::int64_t block(const comm::Group& g) const { return on ? rows / g.size() : rows; }
  std::int64_t first_row(const comm::Group& g) const { return on ? g.rank() * block(g) : 0; }
};

template <class T>
class Linear1D final : public Linear<T> {
public:
  Linear1D(const comm::Group& group, Params<T>& params, Workspace<T>& ws,
           const std::vector<std::string>& weights, const std::vector<std::string>& biases,
           std::int64_t in, std::int64_t out, Role role, double std_dev, std::uint64_t seed,
           SeqSplit split)
      : group_(group), ws_(ws), role_(role), split_(split) {
    check_names(weights, biases);
    const int p = group.size(), r = group.rank();
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (role == Role::first) {
        const std::int64_t cols = out / p;
        w_.push_back(Shared<T>::owned(params, make_param<T>(weights[i], {in, out}, {0, r * cols},
                                                            {in, cols}, std_dev, 0, seed)));
        b_.push_back(Shared<T>::owned(
            params, make_param<T>(biases[i], {out}, {r * cols}, {cols}, 0, 0, seed)));
      } else {
        const std::int64_t rows = in / p;
        w_.push_back(Shared<T>::owned(params, make_param<T>(weights[i], {in, out}, {r * rows, 0},
                                                            {rows, out}, std_dev, 0, seed)));
        // Every rank sees the whole output gradient: identical bias gradients; with
        // sequence parallelism only its rows': partial gradients, summed over the group.
        b_.push_back(Shared<T>::replicated(params,
                                           make_param<T>(biases[i], {out}, {0}, {out}, 0, 0, seed),
                                           group, split.on ? &group : nullptr, ws));
      }
    }
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& y) override {
    for (std::size_t i = 0; i < w_.size(); ++i) {
      if (role_ == Role::second && split_.on) {
        // Partial sums over the input-feature shards, summed and split by rows.
        const Mat<T> partial = ws_.scratch(kFull, x.extent(0), y[i].extent(1));
        kernels::gemm<T>(exec, false, false, T(1), x, w_[i].param().mat(), T(0), partial);
        group_.reduce_scatter(exec, partial, y[i]);
      } else {
        kernels::gemm<T>(exec, false, false, T(1), x, w_[i].param().mat(), T(0), y[i]);
        if (role_ == Role::second)
          group_.all_reduce(exec, y[i]); // partial sums over the input-feature shards
      }
      kernels::bias_add<T>(exec, y[i], b_[i].values());
    }
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& dy,
                const Mat<T>& dx) override {
    for (std::size_t i = 0; i < w_.size(); ++i) {
      Mat<T> whole = dy[i]; // the output gradient of every row
      if (role_ == Role::second && split_.on) {
        whole = ws_.scratch(kFull, x.extent(0), dy[i].extent(1));
        group_.all_gather(exec, dy[i], whole);
      }
      kernels::gemm<T>(exec, true, false, T(1), x, whole, T(1), w_[i].param().grad_mat());
      kernels::bias_backward<T>(exec, dy[i], b_[i].grad(exec));
      b_[i].reduce(exec);
      kernels::gemm<T>(exec, false, true, T(1), whole, w_[i].param().mat(), i == 0 ? T(0) : T(1),
                       dx);
    }
    // The replicated input's gradient sums over output shards; with sequence
    // parallelism the LayerNorm before reduce-scatters it.
    if (role_ == Role::first && !split_.on)
      group_.all_reduce(exec, dx);
  }

private:
  const comm::Group& group_;
  Workspace<T>& ws_;
  Role role_;
  SeqSplit split_;
  std::vector<Shared<T>> w_, b_;
};

// A LayerNorm over this rank's block of the residual stream's rows whose output is
// gathered: the input of a pair's first linear, or of the head.
template <class T>
class GatheredLayerNorm final : public LayerNorm<T> {
public:
  GatheredLayerNorm(std::unique_ptr<LayerNorm<T>> local, const comm::Group& group,
                    std::int64_t rows, std::int64_t features, Workspace<T>& ws)
      : local_(std::move(local)), group_(group), rows_(rows), features_(features), ws_(ws) {}
  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y,
               const Vec<compute_t<T>>& saved) override {
    const Mat<T> mine = ws_.scratch(kLocal, rows_, features_);
    local_->forward(exec, x, mine, saved);
    group_.all_gather(exec, mine, y);
  }
  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                const Vec<compute_t<T>>& saved) override {
    // dy: the ranks' partial gradients of the gathered output; summed, this rank's rows.
    const Mat<T> mine = ws_.scratch(kLocal, rows_, features_);
    group_.reduce_scatter(exec, dy, mine);
    local_->backward(exec, x, mine, dx, saved);
  }

private:
  std::unique_ptr<LayerNorm<T>> local_;
  const comm::Group& group_;
  std::int64_t rows_, features_;
  Workspace<T>& ws_;
};

template <class T>
class Embedding1D final : public Embedding<T> {
public:
  Embedding1D(const comm::Group& group, Params<T>& params, Workspace<T>& ws, int vocab, int padded,
              kernels::Positions pos, std::int64_t hidden, int batch, std::uint64_t seed, Ends ends,
              SeqSplit split)
      : group_(group), ws_(ws), pos_(pos), split_(split), slice_(padded / group.size()),
        first_(group.rank() * (padded / group.size())),
        wte_(Shared<T>::owned(params, make_param<T>("wte", {padded, hidden}, {first_, 0},
                                                    {slice_, hidden}, 0.02, 0, seed, vocab))) {
    const std::int64_t n = static_cast<std::int64_t>(batch) * pos.local;
    if (ends != Ends::head) {
      ends_.lookup(params, pos.total(), hidden, 0, hidden, seed, group, nullptr, n, ws);
    }
    if (ends != Ends::lookup)
      ends_.head(&group, nullptr, n, slice_, vocab, ws);
  }

  void forward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
               const Mat<T>& x) override {
    const Tokens& ids = ends_.tokens->set(exec, tokens);
    // Each token's row comes from the rank that owns it: summed over the group, and
    // with sequence parallelism split by rows.
    if (split_.on) {
      const Mat<T> part = ws_.scratch(kFull, split_.rows, x.extent(1));
      kernels::embedding_lookup<T>(exec, ids, wte_.param().mat(), static_cast<int>(first_), part);
      group_.reduce_scatter(exec, part, x);
    } else {
      kernels::embedding_lookup<T>(exec, ids, wte_.param().mat(), static_cast<int>(first_), x);
      group_.all_reduce(exec, x);
    }
    kernels::position_add<T>(exec, ends_.wpe->param().mat(), pos_, x, split_.first_row(group_));
  }

  void backward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
                const Mat<T>& dx) override {
    // The forward's device tokens may belong to a later micro-batch by now: set them again.
    const auto& index = ends_.index.build(exec, ends_.tokens->set(exec, tokens),
                                          static_cast<int>(first_), static_cast<int>(slice_));
    Mat<T> whole = dx; // the gradient of every row
    if (split_.on) {
      whole = ws_.scratch(kFull, split_.rows, dx.extent(1));
      group_.all_gather(exec, dx, whole);
    }
    kernels::token_backward<T>(exec, index, whole, wte_.param().grad_mat());
    kernels::position_backward<T>(exec, whole, pos_, ends_.wpe->param().grad_mat());
  }

  double loss(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& targets,
              compute_t<T> grad_scale, const Mat<T>& dh) override {
    const Mat<T>& logits = head(exec, h);
    const double sum = (*ends_.loss)(exec, logits, static_cast<int>(first_), targets, grad_scale);
    if (grad_scale != compute_t<T>(0)) {
      kernels::gemm<T>(exec, true, false, T(1), logits, h, T(1), wte_.param().grad_mat());
      kernels::gemm<T>(exec, false, false, T(1), logits, wte_.param().mat(), T(0), dh);
      // Partial over the vocabulary slices; with sequence parallelism ln_f reduce-scatters.
      if (!split_.on)
        group_.all_reduce(exec, dh);
    }
    return sum;
  }

  void logits(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& marks,
              const Vec<float>& out) override {
    ends_.loss->capture(exec, head(exec, h), static_cast<int>(first_), marks, out);
  }

private:
  // This rank's vocabulary slice of the logits of every row.
  const Mat<T>& head(const ExecSpace& exec, const Mat<T>& h) {
    kernels::gemm<T>(exec, false, true, T(1), h, wte_.param().mat(), T(0), ends_.logits);
    return ends_.logits;
  }

  const comm::Group& group_;
  Workspace<T>& ws_;
  kernels::Positions pos_;
  SeqSplit split_;
  std::int64_t slice_, first_;
  Shared<T> wte_;
  EmbeddingEnds<T> ends_;
};

template <class T>
class Mode1D final : public ModeBase<T> {
public:
  explicit Mode1D(const comm::ProcessGrid& grid)
      : ModeBase<T>(grid), group_(grid.tp()),
        sequence_parallel_(grid.layout().sequence_parallel && grid.tp().size() > 1) {}
  const char* name() const override { return group_.size() == 1 ? "none" : "1d"; }

  std::unique_ptr<Linear<T>> linear(Params<T>& params, const std::vector<std::string>& weights,
                                    const std::vector<std::string>& biases, std::int64_t in,
                                    std::int64_t out, std::int64_t rows, Role role, double std_dev,
                                    std::uint64_t seed) override {
    ws_.reserve_all(linear_scratch(this->layout(), in, out, rows, role == Role::second));
    return std::make_unique<Linear1D<T>>(group_, params, ws_, weights, biases, in, out, role,
                                         std_dev, seed, SeqSplit{sequence_parallel_, rows});
  }
  std::unique_ptr<LayerNorm<T>> layernorm(Params<T>& params, const std::string& prefix,
                                          std::int64_t features, std::int64_t rows) override {
    // With sequence parallelism each rank normalises its own rows: partial parameter
    // gradients, summed over the group.
    auto vec = [&](const char* what, double fill) {
      return Shared<T>::replicated(
          params, make_param<T>(prefix + what, {features}, {0}, {features}, 0, fill, 0), group_,
          sequence_parallel_ ? &group_ : nullptr, ws_);
    };
    // beta is registered before gamma, explicitly: the order of the parameters (and
    // so of the gradient buffers) is not left to the order arguments are evaluated in.
    auto beta = vec("/beta", 0);
    auto gamma = vec("/gamma", 1);
    auto local = std::make_unique<SplitLayerNorm<T>>(std::move(gamma), std::move(beta), nullptr,
                                                     features, rows, ws_);
    if (!sequence_parallel_)
      return local;
    ws_.reserve_all(layernorm_scratch(this->layout(), features, rows));
    return std::make_unique<GatheredLayerNorm<T>>(std::move(local), group_, rows, features, ws_);
  }
  std::unique_ptr<Embedding<T>> embedding(Params<T>& params, int vocab, int padded,
                                          kernels::Positions pos, std::int64_t hidden, int batch,
                                          std::uint64_t seed, Ends ends) override {
    ws_.reserve_all(embedding_scratch(this->layout(), ends != Ends::head, ends != Ends::lookup,
                                      batch, pos.local, hidden, padded));
    return std::make_unique<Embedding1D<T>>(group_, params, ws_, vocab, padded, pos, hidden, batch,
                                            seed, ends, split(batch, pos.local));
  }
  std::unique_ptr<MoE<T>> moe(Params<T>& params, const MoeNames& names, const MoeShape& shape,
                              std::int64_t hidden, std::int64_t rows, double std_dev,
                              double proj_std, std::uint64_t seed) override {
    // Under tensor parallelism each rank routes a share of the tokens, its experts'
    // group spanning the tensor ranks (docs/grid.md#expert-parallelism).
    MoePlacement placement = this->moe_placement();
    placement.sequence_parallel = sequence_parallel_;
    return make_moe<T>(params, ws_, names, shape, {hidden, rows, std_dev, proj_std, seed},
                       placement);
  }

private:
  SeqSplit split(int batch, int seq) const {
    return SeqSplit{sequence_parallel_, static_cast<std::int64_t>(batch) * seq};
  }

  using ModeBase<T>::ws_;
  const comm::Group& group_;
  bool sequence_parallel_;
};

} // namespace

template <class T>
std::unique_ptr<Mode<T>> make_1d(const comm::ProcessGrid& grid) {
  return std::make_unique<Mode1D<T>>(grid);
}

template std::unique_ptr<Mode<float>> make_1d<float>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<double>> make_1d<double>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<bf16>> make_1d<bf16>(const comm::ProcessGrid&);

} // namespace cubelm::tp::detail
