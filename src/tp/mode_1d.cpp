// Megatron-style 1D tensor parallelism over the tp group (docs/tensor-parallel.md). With one
// rank in the group it is the single-process model ("none").
//
// The residual stream is replicated on the p ranks. Role::first linears are
// column-parallel (W[:, out/p], forward local, backward all-reduce of dx),
// Role::second linears row-parallel (W[in/p, :], forward all-reduce, bias added
// once after it). The token embedding and the tied head are vocabulary-parallel
// (wte rows split); LayerNorm, wpe and the row-parallel biases are replicated and
// written to checkpoints by tp rank 0 only.

#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "modes.hpp"
#include "parts.hpp"

#include <string>

namespace cubelm::tp::detail {

namespace {

template <class T>
class Linear1D final : public Linear<T> {
public:
  Linear1D(const comm::Group& group, Params<T>& params, Workspace<T>& ws,
           const std::vector<std::string>& weights, const std::vector<std::string>& biases,
           std::int64_t in, std::int64_t out, Role role, double std_dev, std::uint64_t seed)
      : group_(group), role_(role) {
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
        // Every rank sees the whole output gradient: identical bias gradients.
        b_.push_back(Shared<T>::replicated(
            params, make_param<T>(biases[i], {out}, {0}, {out}, 0, 0, seed), group, nullptr, ws));
      }
    }
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& y) override {
    for (std::size_t i = 0; i < w_.size(); ++i) {
      kernels::gemm<T>(exec, false, false, T(1), x, w_[i].param().mat(), T(0), y[i]);
      if (role_ == Role::second)
        group_.all_reduce(exec, y[i]); // partial sums over the input-feature shards
      kernels::bias_add<T>(exec, y[i], b_[i].values());
    }
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& dy,
                const Mat<T>& dx) override {
    for (std::size_t i = 0; i < w_.size(); ++i) {
      kernels::gemm<T>(exec, true, false, T(1), x, dy[i], T(1), w_[i].param().grad_mat());
      kernels::bias_backward<T>(exec, dy[i], b_[i].grad(exec));
      kernels::gemm<T>(exec, false, true, T(1), dy[i], w_[i].param().mat(), i == 0 ? T(0) : T(1),
                       dx);
    }
    if (role_ == Role::first)
      group_.all_reduce(exec, dx); // the replicated input's gradient sums over output shards
  }

private:
  const comm::Group& group_;
  Role role_;
  std::vector<Shared<T>> w_, b_;
};

template <class T>
class Embedding1D final : public Embedding<T> {
public:
  Embedding1D(const comm::Group& group, Params<T>& params, Workspace<T>& ws, int vocab, int padded,
              int seq, std::int64_t hidden, int batch, std::uint64_t seed, Ends ends)
      : group_(group), seq_(seq), slice_(padded / group.size()),
        first_(group.rank() * (padded / group.size())),
        wte_(Shared<T>::owned(params, make_param<T>("wte", {padded, hidden}, {first_, 0},
                                                    {slice_, hidden}, 0.02, 0, seed, vocab))) {
    const std::int64_t n = static_cast<std::int64_t>(batch) * seq;
    if (ends != Ends::head)
      ends_.lookup(params, seq, hidden, 0, hidden, seed, group, nullptr, n, ws);
    if (ends != Ends::lookup)
      ends_.head(&group, nullptr, n, slice_, vocab, ws);
  }

  void forward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
               const Mat<T>& x) override {
    kernels::embedding_lookup<T>(exec, ends_.tokens->set(exec, tokens), wte_.param().mat(),
                                 static_cast<int>(first_), x);
    group_.all_reduce(exec, x); // each token's row comes from the rank that owns it
    kernels::position_add<T>(exec, ends_.wpe->param().mat(), seq_, x);
  }

  void backward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
                const Mat<T>& dx) override {
    // The forward's device tokens may belong to a later micro-batch by now: set them again.
    const auto& index = ends_.index.build(exec, ends_.tokens->set(exec, tokens),
                                          static_cast<int>(first_), static_cast<int>(slice_));
    kernels::token_backward<T>(exec, index, dx, wte_.param().grad_mat());
    kernels::position_backward<T>(exec, dx, seq_, ends_.wpe->param().grad_mat());
  }

  double loss(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& targets,
              T grad_scale, const Mat<T>& dh) override {
    const Mat<T>& logits = ends_.logits;
    kernels::gemm<T>(exec, false, true, T(1), h, wte_.param().mat(), T(0), logits);
    const double sum = (*ends_.loss)(exec, logits, static_cast<int>(first_), targets, grad_scale);
    if (grad_scale != T(0)) {
      kernels::gemm<T>(exec, true, false, T(1), logits, h, T(1), wte_.param().grad_mat());
      kernels::gemm<T>(exec, false, false, T(1), logits, wte_.param().mat(), T(0), dh);
      group_.all_reduce(exec, dh);
    }
    return sum;
  }

private:
  const comm::Group& group_;
  int seq_;
  std::int64_t slice_, first_;
  Shared<T> wte_;
  EmbeddingEnds<T> ends_;
};

template <class T>
class Mode1D final : public ModeBase<T> {
public:
  explicit Mode1D(const comm::ProcessGrid& grid) : ModeBase<T>(grid.layout()), group_(grid.tp()) {}
  const char* name() const override { return group_.size() == 1 ? "none" : "1d"; }
  int sequences(int batch) const override { return batch; }
  std::int64_t outer_cols(std::int64_t features) const override { return features; }
  std::int64_t inner_cols(std::int64_t features) const override { return features / group_.size(); }
  int local_heads(int heads) const override { return heads / group_.size(); }

  std::unique_ptr<Linear<T>> linear(Params<T>& params, const std::vector<std::string>& weights,
                                    const std::vector<std::string>& biases, std::int64_t in,
                                    std::int64_t out, std::int64_t /*rows*/, Role role,
                                    double std_dev, std::uint64_t seed) override {
    return std::make_unique<Linear1D<T>>(group_, params, ws_, weights, biases, in, out, role,
                                         std_dev, seed);
  }
  std::unique_ptr<LayerNorm<T>> layernorm(Params<T>& params, const std::string& prefix,
                                          std::int64_t features, std::int64_t rows) override {
    auto vec = [&](const char* what, double fill) {
      return Shared<T>::replicated(
          params, make_param<T>(prefix + what, {features}, {0}, {features}, 0, fill, 0), group_,
          nullptr, ws_);
    };
    // beta is registered before gamma, explicitly: the order of the parameters (and
    // so of the gradient buffers) is not left to the order arguments are evaluated in.
    auto beta = vec("/beta", 0);
    auto gamma = vec("/gamma", 1);
    return std::make_unique<SplitLayerNorm<T>>(std::move(gamma), std::move(beta), nullptr, features,
                                               rows, ws_);
  }
  std::unique_ptr<Embedding<T>> embedding(Params<T>& params, int vocab, int padded, int seq,
                                          std::int64_t hidden, int batch, std::uint64_t seed,
                                          Ends ends) override {
    return std::make_unique<Embedding1D<T>>(group_, params, ws_, vocab, padded, seq, hidden, batch,
                                            seed, ends);
  }

private:
  using ModeBase<T>::ws_;
  const comm::Group& group_;
};

} // namespace

template <class T>
std::unique_ptr<Mode<T>> make_1d(const comm::ProcessGrid& grid) {
  return std::make_unique<Mode1D<T>>(grid);
}

template std::unique_ptr<Mode<float>> make_1d<float>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<double>> make_1d<double>(const comm::ProcessGrid&);

} // namespace cubelm::tp::detail
