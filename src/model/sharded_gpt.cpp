#include "cubelm/model/sharded_gpt.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/kernels/layers.hpp"
#include "cubelm/kernels/optim.hpp"

#include <cmath>
#include <string>

namespace cubelm::model {

template <class T>
struct ShardedGPT<T>::Layer {
  std::unique_ptr<tp::LayerNorm<T>> ln1, ln2;
  std::unique_ptr<tp::Linear<T>> qkv, proj, fc1, fc2;
  Mat<T> ln1_out, q, k, v, att, ln2_out, h, g, th; // saved activations (th: GELU's tanh)
  kernels::Tensor4<T> probs;
};

namespace {
template <class T>
Mat<T> matrix(const char* label, std::int64_t rows, std::int64_t cols) {
  return Mat<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
}
} // namespace

template <class T>
ShardedGPT<T>::ShardedGPT(const io::ModelConfig& config, int batch, std::uint64_t seed,
                          tp::Mode<T>& mode)
    : config_(config), mode_(mode), batch_(batch), sequences_(mode.sequences(batch)),
      heads_(mode.local_heads(config.heads)) {
  const std::int64_t H = config.hidden, S = config.seq_len, L = config.layers;
  const std::int64_t N = static_cast<std::int64_t>(sequences_) * S;
  const std::int64_t Ho = mode.outer_cols(H), Hi = mode.inner_cols(H), Fi = mode.inner_cols(4 * H);
  const double std_dev = 0.02, proj_std = 0.02 / std::sqrt(2.0 * L);
  embedding_ = mode.embedding(params_, config.vocab_size, config.seq_len, H, batch, seed);
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = "layers/" + std::to_string(l) + "/";
    auto y = std::make_unique<Layer>();
    y->ln1 = mode.layernorm(params_, p + "ln1", H, N);
    y->qkv = mode.linear(params_, {p + "attn/wq", p + "attn/wk", p + "attn/wv"},
                         {p + "attn/bq", p + "attn/bk", p + "attn/bv"}, H, H, N, tp::Role::first,
                         std_dev, seed);
    y->proj = mode.linear(params_, {p + "attn/wo"}, {p + "attn/bo"}, H, H, N, tp::Role::second,
                          proj_std, seed);
    y->ln2 = mode.layernorm(params_, p + "ln2", H, N);
    y->fc1 = mode.linear(params_, {p + "mlp/w1"}, {p + "mlp/b1"}, H, 4 * H, N, tp::Role::first,
                         std_dev, seed);
    y->fc2 = mode.linear(params_, {p + "mlp/w2"}, {p + "mlp/b2"}, 4 * H, H, N, tp::Role::second,
                         proj_std, seed);
    y->ln1_out = matrix<T>("cubelm::ln1", N, Ho);
    y->ln2_out = matrix<T>("cubelm::ln2", N, Ho);
    y->q = matrix<T>("cubelm::q", N, Hi);
    y->k = matrix<T>("cubelm::k", N, Hi);
    y->v = matrix<T>("cubelm::v", N, Hi);
    y->att = matrix<T>("cubelm::att", N, Hi);
    y->h = matrix<T>("cubelm::h", N, Fi);
    y->g = matrix<T>("cubelm::g", N, Fi);
    y->th = matrix<T>("cubelm::gelu_tanh", N, Fi);
    y->probs = kernels::Tensor4<T>("cubelm::probs", sequences_, heads_, S, S);
    layers_.push_back(std::move(y));
  }
  lnf_ = mode.layernorm(params_, "ln_f", H, N);
  for (std::int64_t i = 0; i < 2 * L + 1; ++i)
    stream_.push_back(matrix<T>("cubelm::stream", N, Ho));
  lnf_out_ = matrix<T>("cubelm::ln_f", N, Ho);
  d_outer_ = matrix<T>("cubelm::d_outer", N, Ho);
  dx_ = matrix<T>("cubelm::dx", N, Ho);
  dq_ = matrix<T>("cubelm::dq", N, Hi);
  dk_ = matrix<T>("cubelm::dk", N, Hi);
  dv_ = matrix<T>("cubelm::dv", N, Hi);
  da_ = matrix<T>("cubelm::da", N, Hi);
  dh_ = matrix<T>("cubelm::dh", N, Fi);
  dg_ = matrix<T>("cubelm::dg", N, Fi);
  dscratch_ = kernels::Tensor4<T>("cubelm::dscores", sequences_, heads_, S, S);
  work_ = kernels::AttentionWorkspace<T>(sequences_, heads_, config.seq_len,
                                         static_cast<int>(Hi / heads_));
}

template <class T>
ShardedGPT<T>::~ShardedGPT() = default;

template <class T>
Param<T>& ShardedGPT<T>::param(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name)
      return p;
  CUBELM_ASSERT(false, "no parameter called '" + name + "'");
  return params_.front();
}

template <class T>
Memory ShardedGPT<T>::memory() const {
  Memory mem;
  for (const auto& p : params_) {
    mem.parameters += p.size() * static_cast<std::int64_t>(sizeof(T));
    mem.gradients += p.size() * static_cast<std::int64_t>(sizeof(T));
  }
  std::int64_t elements = 0;
  auto add = [&](const auto& view) { elements += static_cast<std::int64_t>(view.span()); };
  for (const auto& y : layers_) {
    for (const Mat<T>* m :
         {&y->ln1_out, &y->q, &y->k, &y->v, &y->att, &y->ln2_out, &y->h, &y->g, &y->th})
      add(*m);
    add(y->probs);
  }
  for (const auto& m : stream_)
    add(m);
  for (const Mat<T>* m : {&lnf_out_, &d_outer_, &dx_, &dq_, &dk_, &dv_, &da_, &dh_, &dg_})
    add(*m);
  add(dscratch_);
  add(work_.q);
  add(work_.k);
  add(work_.v);
  add(work_.o);
  mem.activations = elements * static_cast<std::int64_t>(sizeof(T)) + mode_.workspace_bytes();
  return mem;
}

template <class T>
void ShardedGPT<T>::zero_grad() {
  for (auto& p : params_)
    Kokkos::deep_copy(p.grad, T(0));
}

template <class T>
double ShardedGPT<T>::forward_backward(const std::vector<std::int32_t>& inputs,
                                       const std::vector<std::int32_t>& targets,
                                       double grad_scale) {
  using namespace kernels;
  const ExecSpace exec;
  const std::size_t expected = static_cast<std::size_t>(batch_) * config_.seq_len;
  CUBELM_ASSERT(inputs.size() == expected && targets.size() == expected,
                "forward_backward needs the whole micro-batch: " + std::to_string(expected) +
                    " token ids");
  embedding_->forward(exec, inputs, stream_[0]);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    Layer& y = *layers_[l];
    const Mat<T>& x = stream_[2 * l];
    const Mat<T>& x1 = stream_[2 * l + 1];
    const Mat<T>& x2 = stream_[2 * l + 2];
    y.ln1->forward(exec, x, y.ln1_out);
    y.qkv->forward(exec, y.ln1_out, {y.q, y.k, y.v});
    attention_forward<T>(exec, y.q, y.k, y.v, heads_, y.probs, work_, y.att);
    y.proj->forward(exec, y.att, {x1});
    add_inplace<T>(exec, x1, x);
    y.ln2->forward(exec, x1, y.ln2_out);
    y.fc1->forward(exec, y.ln2_out, {y.h});
    gelu_forward<T>(exec, y.h, y.g, y.th);
    y.fc2->forward(exec, y.g, {x2});
    add_inplace<T>(exec, x2, x1);
  }
  lnf_->forward(exec, stream_.back(), lnf_out_);
  const double loss = embedding_->loss(exec, lnf_out_, targets, T(grad_scale), d_outer_);
  if (grad_scale != 0.0)
    backward(exec);
  exec.fence();
  return loss;
}

template <class T>
void ShardedGPT<T>::backward(const ExecSpace& exec) {
  using namespace kernels;
  Kokkos::deep_copy(exec, dx_, T(0));
  lnf_->backward(exec, stream_.back(), d_outer_, dx_);
  for (std::size_t li = layers_.size(); li-- > 0;) {
    Layer& y = *layers_[li];
    const Mat<T>& x = stream_[2 * li];
    const Mat<T>& x1 = stream_[2 * li + 1];
    // MLP half; dx_ holds d x2, the gradient of the block's output.
    y.fc2->backward(exec, y.g, {dx_}, dg_);
    gelu_backward<T>(exec, y.h, y.th, dg_, dh_);
    y.fc1->backward(exec, y.ln2_out, {dh_}, d_outer_);
    y.ln2->backward(exec, x1, d_outer_, dx_);
    // Attention half; dx_ holds d x1.
    y.proj->backward(exec, y.att, {dx_}, da_);
    attention_backward<T>(exec, y.q, y.k, y.v, heads_, y.probs, da_, dscratch_, work_, dq_, dk_,
                          dv_);
    y.qkv->backward(exec, y.ln1_out, {dq_, dk_, dv_}, d_outer_);
    y.ln1->backward(exec, x, d_outer_, dx_);
  }
  embedding_->backward(exec, dx_);
}

template <class T>
GridModel<T>::GridModel(const io::ModelConfig& config, int batch, std::uint64_t seed,
                        const comm::Layout& layout, const comm::Communicator& comm)
    : grid(std::make_unique<comm::ProcessGrid>(layout, comm)), mode(tp::make_mode<T>(*grid)),
      model(std::make_unique<ShardedGPT<T>>(config, batch, seed, *mode)) {}

template <class T>
GridModel<T> GridModel<T>::single(const io::ModelConfig& config, int batch, std::uint64_t seed) {
  return GridModel(config, batch, seed, comm::Layout{},
                   comm::Communicator::duplicate(MPI_COMM_SELF));
}

template class ShardedGPT<float>;
template class ShardedGPT<double>;
template struct GridModel<float>;
template struct GridModel<double>;

} // namespace cubelm::model
