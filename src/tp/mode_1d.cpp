// Megatron-style 1D tensor parallelism over the tp group (DESIGN §3). With one
// rank in the group it is the single-process model ("none").
//
// The residual stream is replicated on the p ranks. Role::first linears are
// column-parallel (W[:, out/p], forward local, backward all-reduce of dx),
// Role::second linears row-parallel (W[in/p, :], forward all-reduce, bias added
// once after it). The token embedding and the tied head are vocabulary-parallel
// (wte rows split); LayerNorm, wpe and the row-parallel biases are replicated and
// written to checkpoints by tp rank 0 only.

#include "cubelm/core/error.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/layers.hpp"
#include "cubelm/kernels/optim.hpp"
#include "cubelm/tp/mode.hpp"

#include <string>

namespace cubelm::tp {

namespace {

using kernels::Tokens;

// A parameter replicated on every rank of the group: tp rank 0 writes and counts it.
template <class T>
model::Param<T>& replicated(Params<T>& params, model::Param<T> p, int rank) {
  p.writer = rank == 0;
  p.counted = rank == 0;
  params.push_back(std::move(p));
  return params.back();
}

template <class T>
class Linear1D final : public Linear<T> {
public:
  Linear1D(const comm::Group& group, Params<T>& params, const std::vector<std::string>& weights,
           const std::vector<std::string>& biases, std::int64_t in, std::int64_t out, Role role,
           double std_dev, std::uint64_t seed)
      : group_(group), role_(role) {
    const int p = group.size(), r = group.rank();
    for (std::size_t i = 0; i < weights.size(); ++i) {
      if (role == Role::first) {
        const std::int64_t cols = out / p;
        params.push_back(model::make_param<T>(weights[i], {in, out}, {0, r * cols}, {in, cols},
                                              std_dev, 0, seed));
        w_.push_back(&params.back());
        params.push_back(model::make_param<T>(biases[i], {out}, {r * cols}, {cols}, 0, 0, seed));
        b_.push_back(&params.back());
      } else {
        const std::int64_t rows = in / p;
        params.push_back(model::make_param<T>(weights[i], {in, out}, {r * rows, 0}, {rows, out},
                                              std_dev, 0, seed));
        w_.push_back(&params.back());
        b_.push_back(
            &replicated(params, model::make_param<T>(biases[i], {out}, {0}, {out}, 0, 0, seed), r));
      }
    }
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& y) override {
    for (std::size_t i = 0; i < w_.size(); ++i) {
      kernels::gemm<T>(exec, false, false, T(1), x, w_[i]->mat(), T(0), y[i]);
      if (role_ == Role::second)
        group_.all_reduce(exec, y[i]); // partial sums over the input-feature shards
      kernels::bias_add<T>(exec, y[i], b_[i]->value);
    }
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& dy,
                const Mat<T>& dx) override {
    for (std::size_t i = 0; i < w_.size(); ++i) {
      kernels::gemm<T>(exec, true, false, T(1), x, dy[i], T(1), w_[i]->grad_mat());
      kernels::bias_backward<T>(exec, dy[i], b_[i]->grad);
      kernels::gemm<T>(exec, false, true, T(1), dy[i], w_[i]->mat(), i == 0 ? T(0) : T(1), dx);
    }
    if (role_ == Role::first)
      group_.all_reduce(exec, dx); // the replicated input's gradient sums over output shards
  }

private:
  const comm::Group& group_;
  Role role_;
  std::vector<model::Param<T>*> w_, b_;
};

template <class T>
class LayerNorm1D final : public LayerNorm<T> {
public:
  LayerNorm1D(const comm::Group& group, Params<T>& params, const std::string& prefix,
              std::int64_t features, std::int64_t rows, std::uint64_t seed)
      : gamma_(&replicated(
            params,
            model::make_param<T>(prefix + "/gamma", {features}, {0}, {features}, 0, 1, seed),
            group.rank())),
        beta_(&replicated(
            params, model::make_param<T>(prefix + "/beta", {features}, {0}, {features}, 0, 0, seed),
            group.rank())),
        mean_("cubelm::ln_mean", rows), rstd_("cubelm::ln_rstd", rows) {}

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y) override {
    kernels::layernorm_forward<T>(exec, x, gamma_->value, beta_->value, y, mean_, rstd_);
  }
  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy,
                const Mat<T>& dx) override {
    kernels::layernorm_backward<T>(exec, dy, x, gamma_->value, mean_, rstd_, dx, gamma_->grad,
                                   beta_->grad);
  }

private:
  model::Param<T>*gamma_, *beta_;
  Vec<T> mean_, rstd_;
};

template <class T>
class Embedding1D final : public Embedding<T> {
public:
  Embedding1D(const comm::Group& group, Params<T>& params, int vocab, int seq, std::int64_t hidden,
              int batch, std::uint64_t seed)
      : group_(group), seq_(seq), slice_(vocab / group.size()),
        first_(group.rank() * (vocab / group.size())) {
    CUBELM_ASSERT(vocab % group.size() == 0, "1d: vocab_size must be divisible by tensor_size");
    const std::int64_t n = static_cast<std::int64_t>(batch) * seq;
    params.push_back(
        model::make_param<T>("wte", {vocab, hidden}, {first_, 0}, {slice_, hidden}, 0.02, 0, seed));
    wte_ = &params.back();
    wpe_ = &replicated(
        params, model::make_param<T>("wpe", {seq, hidden}, {0, 0}, {seq, hidden}, 0.02, 0, seed),
        group.rank());
    tokens_ = Tokens("cubelm::tokens", n);
    targets_ = Tokens("cubelm::targets", n);
    logits_ = Mat<T>("cubelm::logits", n, slice_);
    stats_ = Mat<T>("cubelm::ce_stats", n, 2);
    mx_ = Vec<T>("cubelm::ce_max", n);
    losses_ = Vec<T>("cubelm::losses", n);
  }

  void forward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
               const Mat<T>& x) override {
    copy_tokens(tokens, tokens_);
    index_ = kernels::make_token_index(tokens, static_cast<int>(first_), static_cast<int>(slice_));
    kernels::embedding_lookup<T>(exec, tokens_, wte_->mat(), static_cast<int>(first_), x);
    group_.all_reduce(exec, x); // each token's row comes from the rank that owns it
    kernels::position_add<T>(exec, wpe_->mat(), seq_, x);
  }

  void backward(const ExecSpace& exec, const Mat<T>& dx) override {
    kernels::token_backward<T>(exec, index_, dx, wte_->grad_mat());
    kernels::position_backward<T>(exec, dx, seq_, wpe_->grad_mat());
  }

  double loss(const ExecSpace& exec, const Mat<T>& h, const std::vector<std::int32_t>& targets,
              T grad_scale, const Mat<T>& dh) override {
    copy_tokens(targets, targets_);
    const int first = static_cast<int>(first_);
    kernels::gemm<T>(exec, false, true, T(1), h, wte_->mat(), T(0), logits_);
    kernels::row_max<T>(exec, logits_, mx_);
    group_.all_reduce(exec, mx_, comm::ReduceOp::max);
    kernels::row_sumexp_target<T>(exec, logits_, mx_, targets_, first, stats_);
    group_.all_reduce(exec, stats_); // sums of exp and the target logit over vocabulary slices
    kernels::vocab_cross_entropy<T>(exec, logits_, mx_, stats_, targets_, first, losses_,
                                    grad_scale);
    if (grad_scale != T(0)) {
      kernels::gemm<T>(exec, true, false, T(1), logits_, h, T(1), wte_->grad_mat());
      kernels::gemm<T>(exec, false, false, T(1), logits_, wte_->mat(), T(0), dh);
      group_.all_reduce(exec, dh);
    }
    return kernels::sum<T>(exec, losses_);
  }

private:
  static void copy_tokens(const std::vector<std::int32_t>& host, const Tokens& dev) {
    CUBELM_ASSERT(host.size() == dev.extent(0), "token count does not match the micro-batch");
    auto h = Kokkos::create_mirror_view(dev);
    for (std::size_t i = 0; i < host.size(); ++i)
      h(i) = host[i];
    Kokkos::deep_copy(dev, h);
  }

  const comm::Group& group_;
  int seq_;
  std::int64_t slice_, first_;
  model::Param<T>*wte_, *wpe_;
  Tokens tokens_, targets_;
  kernels::TokenIndex index_;
  Mat<T> logits_, stats_;
  Vec<T> mx_, losses_;
};

template <class T>
class Mode1D final : public Mode<T> {
public:
  explicit Mode1D(const comm::Group& group) : group_(group) {}
  const char* name() const override { return group_.size() == 1 ? "none" : "1d"; }
  Rows rows(int batch) const override { return {0, batch}; }
  std::int64_t outer_cols(std::int64_t features) const override { return features; }
  std::int64_t inner_cols(std::int64_t features) const override { return features / group_.size(); }
  int local_heads(int heads) const override { return heads / group_.size(); }

  std::unique_ptr<Linear<T>> linear(Params<T>& params, const std::vector<std::string>& weights,
                                    const std::vector<std::string>& biases, std::int64_t in,
                                    std::int64_t out, Role role, double std_dev,
                                    std::uint64_t seed) override {
    const std::int64_t split = role == Role::first ? out : in;
    CUBELM_ASSERT(split % group_.size() == 0,
                  "1d: a linear's split dimension must be divisible by tensor_size");
    return std::make_unique<Linear1D<T>>(group_, params, weights, biases, in, out, role, std_dev,
                                         seed);
  }
  std::unique_ptr<LayerNorm<T>> layernorm(Params<T>& params, const std::string& prefix,
                                          std::int64_t features, std::int64_t rows) override {
    return std::make_unique<LayerNorm1D<T>>(group_, params, prefix, features, rows, 0);
  }
  std::unique_ptr<Embedding<T>> embedding(Params<T>& params, int vocab, int seq,
                                          std::int64_t hidden, int batch,
                                          std::uint64_t seed) override {
    return std::make_unique<Embedding1D<T>>(group_, params, vocab, seq, hidden, batch, seed);
  }

private:
  const comm::Group& group_;
};

} // namespace

template <class T>
std::unique_ptr<Mode<T>> make_mode(const comm::ProcessGrid& grid) {
  switch (grid.layout().mode) {
  case comm::TensorMode::none:
  case comm::TensorMode::d1:
    return std::make_unique<Mode1D<T>>(grid.tp());
  case comm::TensorMode::d2:
  case comm::TensorMode::d3:
    break;
  }
  throw Error(std::string("parallel.tensor_mode = \"") + comm::mode_name(grid.layout().mode) +
                  "\": this version trains with tensor_mode \"none\" and \"1d\" only",
              true);
}

template std::unique_ptr<Mode<float>> make_mode<float>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<double>> make_mode<double>(const comm::ProcessGrid&);

} // namespace cubelm::tp
