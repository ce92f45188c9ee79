#include "cubelm/model/gpt.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/kernels/attention.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/optim.hpp"

#include <cmath>

namespace cubelm::model {

template <class T>
Param<T>& GPT<T>::add(const std::string& name, std::vector<std::int64_t> shape, double std_dev,
                      double fill) {
  const std::vector<std::int64_t> zeros(shape.size(), 0);
  params_.push_back(make_param<T>(name, shape, zeros, shape, std_dev, fill, seed_));
  return params_.back();
}

template <class T>
GPT<T>::GPT(const io::ModelConfig& config, int batch, std::uint64_t seed)
    : config_(config), batch_(batch), seed_(seed) {
  const std::int64_t V = config.vocab_size, S = config.seq_len, H = config.hidden;
  const std::int64_t L = config.layers, N = static_cast<std::int64_t>(batch) * S;
  const double std_dev = 0.02, proj_std = 0.02 / std::sqrt(2.0 * L);
  params_.reserve(4 + 16 * L); // pointers into params_ stay valid
  wte_ = &add("wte", {V, H}, std_dev, 0);
  wpe_ = &add("wpe", {S, H}, std_dev, 0);
  auto alloc = [](const char* label, std::int64_t r, std::int64_t c) {
    return Mat<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), r, c);
  };
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = "layers/" + std::to_string(l) + "/";
    Layer ly{};
    ly.ln1_g = &add(p + "ln1/gamma", {H}, 0, 1);
    ly.ln1_b = &add(p + "ln1/beta", {H}, 0, 0);
    ly.wq = &add(p + "attn/wq", {H, H}, std_dev, 0);
    ly.wk = &add(p + "attn/wk", {H, H}, std_dev, 0);
    ly.wv = &add(p + "attn/wv", {H, H}, std_dev, 0);
    ly.wo = &add(p + "attn/wo", {H, H}, proj_std, 0);
    ly.bq = &add(p + "attn/bq", {H}, 0, 0);
    ly.bk = &add(p + "attn/bk", {H}, 0, 0);
    ly.bv = &add(p + "attn/bv", {H}, 0, 0);
    ly.bo = &add(p + "attn/bo", {H}, 0, 0);
    ly.ln2_g = &add(p + "ln2/gamma", {H}, 0, 1);
    ly.ln2_b = &add(p + "ln2/beta", {H}, 0, 0);
    ly.w1 = &add(p + "mlp/w1", {H, 4 * H}, std_dev, 0);
    ly.b1 = &add(p + "mlp/b1", {4 * H}, 0, 0);
    ly.w2 = &add(p + "mlp/w2", {4 * H, H}, proj_std, 0);
    ly.b2 = &add(p + "mlp/b2", {H}, 0, 0);
    ly.ln1 = alloc("cubelm::ln1", N, H);
    ly.q = alloc("cubelm::q", N, H);
    ly.k = alloc("cubelm::k", N, H);
    ly.v = alloc("cubelm::v", N, H);
    ly.att = alloc("cubelm::att", N, H);
    ly.ln2 = alloc("cubelm::ln2", N, H);
    ly.h = alloc("cubelm::h", N, 4 * H);
    ly.g = alloc("cubelm::g", N, 4 * H);
    ly.ln1_mean = Vec<T>("cubelm::ln1_mean", N);
    ly.ln1_rstd = Vec<T>("cubelm::ln1_rstd", N);
    ly.ln2_mean = Vec<T>("cubelm::ln2_mean", N);
    ly.ln2_rstd = Vec<T>("cubelm::ln2_rstd", N);
    ly.probs = Tensor4<T>("cubelm::probs", batch, config.heads, S, S);
    layers_.push_back(ly);
  }
  lnf_g_ = &add("ln_f/gamma", {H}, 0, 1);
  lnf_b_ = &add("ln_f/beta", {H}, 0, 0);
  for (std::int64_t i = 0; i < 2 * L + 1; ++i)
    stream_.push_back(alloc("cubelm::stream", N, H));
  lnf_ = alloc("cubelm::ln_f", N, H);
  logits_ = alloc("cubelm::logits", N, V);
  lnf_mean_ = Vec<T>("cubelm::lnf_mean", N);
  lnf_rstd_ = Vec<T>("cubelm::lnf_rstd", N);
  losses_ = Vec<T>("cubelm::losses", N);
  inputs_ = kernels::Tokens("cubelm::inputs", N);
  targets_ = kernels::Tokens("cubelm::targets", N);
  dx_ = alloc("cubelm::dx", N, H);
  dln_ = alloc("cubelm::dln", N, H);
  da_ = alloc("cubelm::da", N, H);
  dq_ = alloc("cubelm::dq", N, H);
  dk_ = alloc("cubelm::dk", N, H);
  dv_ = alloc("cubelm::dv", N, H);
  dh_ = alloc("cubelm::dh", N, 4 * H);
  dg_ = alloc("cubelm::dg", N, 4 * H);
  dscratch_ = Tensor4<T>("cubelm::dscores", batch, config.heads, S, S);
  attn_work_ = kernels::AttentionWorkspace<T>(batch, config.heads, config.seq_len,
                                              config.hidden / config.heads);
}

template <class T>
Param<T>& GPT<T>::param(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name)
      return p;
  CUBELM_ASSERT(false, "no parameter called '" + name + "'");
  return params_.front();
}

template <class T>
void GPT<T>::zero_grad() {
  for (auto& p : params_)
    Kokkos::deep_copy(p.grad, T(0));
}

template <class T>
std::int64_t GPT<T>::memory_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& p : params_)
    bytes += 2 * p.size() * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t N = static_cast<std::int64_t>(batch_) * config_.seq_len;
  const std::int64_t H = config_.hidden, S = config_.seq_len;
  const std::int64_t per_layer = N * (14 * H + 4) + 2 * batch_ * config_.heads * S * S;
  bytes += (config_.layers * per_layer + (2 * config_.layers + 1) * N * H + N * H +
            N * config_.vocab_size + 3 * N + 6 * N * H + 4 * N * H + 4 * N * H) *
           static_cast<std::int64_t>(sizeof(T));
  return bytes;
}

template <class T>
double GPT<T>::forward_backward(const std::vector<std::int32_t>& inputs,
                                const std::vector<std::int32_t>& targets, double grad_scale) {
  const std::size_t N = static_cast<std::size_t>(batch_) * config_.seq_len;
  CUBELM_ASSERT(inputs.size() == N && targets.size() == N,
                "forward_backward needs batch x seq_len inputs and targets");
  auto hi = Kokkos::create_mirror_view(inputs_);
  auto ht = Kokkos::create_mirror_view(targets_);
  for (std::size_t n = 0; n < N; ++n) {
    hi(n) = inputs[n];
    ht(n) = targets[n];
  }
  Kokkos::deep_copy(inputs_, hi);
  Kokkos::deep_copy(targets_, ht);
  host_inputs_ = inputs;
  const ExecSpace exec;
  forward(exec);
  kernels::cross_entropy<T>(exec, logits_, targets_, losses_, T(grad_scale));
  const double loss_sum = kernels::sum<T>(exec, losses_);
  if (grad_scale != 0.0)
    backward(exec);
  exec.fence();
  return loss_sum;
}

template <class T>
void GPT<T>::forward(const ExecSpace& exec) {
  using namespace kernels;
  const int S = config_.seq_len;
  embedding_forward<T>(exec, inputs_, wte_->mat(), wpe_->mat(), S, stream_[0]);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    Layer& y = layers_[l];
    const Mat<T>& x = stream_[2 * l];
    const Mat<T>& x1 = stream_[2 * l + 1];
    const Mat<T>& x2 = stream_[2 * l + 2];
    layernorm_forward<T>(exec, x, y.ln1_g->value, y.ln1_b->value, y.ln1, y.ln1_mean, y.ln1_rstd);
    gemm<T>(exec, false, false, T(1), y.ln1, y.wq->mat(), T(0), y.q);
    bias_add<T>(exec, y.q, y.bq->value);
    gemm<T>(exec, false, false, T(1), y.ln1, y.wk->mat(), T(0), y.k);
    bias_add<T>(exec, y.k, y.bk->value);
    gemm<T>(exec, false, false, T(1), y.ln1, y.wv->mat(), T(0), y.v);
    bias_add<T>(exec, y.v, y.bv->value);
    attention_forward<T>(exec, y.q, y.k, y.v, config_.heads, y.probs, attn_work_, y.att);
    gemm<T>(exec, false, false, T(1), y.att, y.wo->mat(), T(0), x1);
    bias_add<T>(exec, x1, y.bo->value);
    add_inplace<T>(exec, x1, x);
    layernorm_forward<T>(exec, x1, y.ln2_g->value, y.ln2_b->value, y.ln2, y.ln2_mean, y.ln2_rstd);
    gemm<T>(exec, false, false, T(1), y.ln2, y.w1->mat(), T(0), y.h);
    bias_add<T>(exec, y.h, y.b1->value);
    gelu_forward<T>(exec, y.h, y.g);
    gemm<T>(exec, false, false, T(1), y.g, y.w2->mat(), T(0), x2);
    bias_add<T>(exec, x2, y.b2->value);
    add_inplace<T>(exec, x2, x1);
  }
  layernorm_forward<T>(exec, stream_.back(), lnf_g_->value, lnf_b_->value, lnf_, lnf_mean_,
                       lnf_rstd_);
  gemm<T>(exec, false, true, T(1), lnf_, wte_->mat(), T(0), logits_); // tied LM head
}

template <class T>
void GPT<T>::backward(const ExecSpace& exec) {
  using namespace kernels;
  // logits_ now holds d loss / d logits (scaled by cross_entropy).
  gemm<T>(exec, true, false, T(1), logits_, lnf_, T(1), wte_->grad_mat());
  gemm<T>(exec, false, false, T(1), logits_, wte_->mat(), T(0), dln_);
  Kokkos::deep_copy(exec, dx_, T(0));
  layernorm_backward<T>(exec, dln_, stream_.back(), lnf_g_->value, lnf_mean_, lnf_rstd_, dx_,
                        lnf_g_->grad, lnf_b_->grad);
  for (std::size_t li = layers_.size(); li-- > 0;) {
    Layer& y = layers_[li];
    const Mat<T>& x = stream_[2 * li];
    const Mat<T>& x1 = stream_[2 * li + 1];
    // MLP half: x2 = x1 + (gelu(ln2 w1 + b1) w2 + b2); dx_ holds d x2.
    gemm<T>(exec, true, false, T(1), y.g, dx_, T(1), y.w2->grad_mat());
    bias_backward<T>(exec, dx_, y.b2->grad);
    gemm<T>(exec, false, true, T(1), dx_, y.w2->mat(), T(0), dg_);
    gelu_backward<T>(exec, y.h, dg_, dh_);
    gemm<T>(exec, true, false, T(1), y.ln2, dh_, T(1), y.w1->grad_mat());
    bias_backward<T>(exec, dh_, y.b1->grad);
    gemm<T>(exec, false, true, T(1), dh_, y.w1->mat(), T(0), dln_);
    layernorm_backward<T>(exec, dln_, x1, y.ln2_g->value, y.ln2_mean, y.ln2_rstd, dx_,
                          y.ln2_g->grad, y.ln2_b->grad);
    // Attention half: x1 = x + (attn(ln1) wo + bo); dx_ holds d x1.
    gemm<T>(exec, true, false, T(1), y.att, dx_, T(1), y.wo->grad_mat());
    bias_backward<T>(exec, dx_, y.bo->grad);
    gemm<T>(exec, false, true, T(1), dx_, y.wo->mat(), T(0), da_);
    attention_backward<T>(exec, y.q, y.k, y.v, config_.heads, y.probs, da_, dscratch_, attn_work_,
                          dq_, dk_, dv_);
    gemm<T>(exec, true, false, T(1), y.ln1, dq_, T(1), y.wq->grad_mat());
    gemm<T>(exec, true, false, T(1), y.ln1, dk_, T(1), y.wk->grad_mat());
    gemm<T>(exec, true, false, T(1), y.ln1, dv_, T(1), y.wv->grad_mat());
    bias_backward<T>(exec, dq_, y.bq->grad);
    bias_backward<T>(exec, dk_, y.bk->grad);
    bias_backward<T>(exec, dv_, y.bv->grad);
    gemm<T>(exec, false, true, T(1), dq_, y.wq->mat(), T(0), dln_);
    gemm<T>(exec, false, true, T(1), dk_, y.wk->mat(), T(1), dln_);
    gemm<T>(exec, false, true, T(1), dv_, y.wv->mat(), T(1), dln_);
    layernorm_backward<T>(exec, dln_, x, y.ln1_g->value, y.ln1_mean, y.ln1_rstd, dx_, y.ln1_g->grad,
                          y.ln1_b->grad);
  }
  embedding_backward<T>(exec, make_token_index(host_inputs_, config_.vocab_size), dx_,
                        config_.seq_len, wte_->grad_mat(), wpe_->grad_mat());
}

template class GPT<float>;
template class GPT<double>;

} // namespace cubelm::model
