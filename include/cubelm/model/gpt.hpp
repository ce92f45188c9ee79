#pragma once
/// \file
/// \brief The GPT-2 model of DESIGN §4 on one device, with its parameter registry.
///
/// Every parameter is registered under its global name, which is also its
/// checkpoint path below /model (e.g. "layers/0/attn/wq"). Initialisation is a
/// pure function of (seed, name, element index), so it does not depend on the
/// layout or on the order in which tensors are created.

#include "cubelm/io/deck.hpp"
#include "cubelm/kernels/attention.hpp"
#include "cubelm/kernels/layers.hpp"
#include "cubelm/model/param.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::model {

using kernels::Tensor4;

/// \brief GPT-2: token + position embedding, L pre-LayerNorm blocks, final
/// LayerNorm, LM head tied to the token embedding, mean cross-entropy.
template <class T>
class GPT {
public:
  /// \brief Allocates parameters and activations for micro-batches of `batch` sequences.
  GPT(const io::ModelConfig& config, int batch, std::uint64_t seed);

  const io::ModelConfig& config() const { return config_; }
  int batch() const { return batch_; }
  std::vector<Param<T>>& params() { return params_; }
  const std::vector<Param<T>>& params() const { return params_; }
  /// \brief The parameter called `name`; throws InternalError if there is none.
  Param<T>& param(const std::string& name);

  /// \brief Forward pass over `inputs` (batch x seq_len token ids); returns the
  /// sum of the per-token losses against `targets`. With `grad_scale` non-zero
  /// it also runs backward, adding grad_scale x d(sum of losses) to every
  /// parameter gradient (pass 1 / tokens of the global batch for the mean loss).
  double forward_backward(const std::vector<std::int32_t>& inputs,
                          const std::vector<std::int32_t>& targets, double grad_scale);

  /// \brief Sets every gradient to zero.
  void zero_grad();
  /// \brief Bytes of parameters, gradients and activations held by this model.
  std::int64_t memory_bytes() const;

private:
  struct Layer {
    Param<T>*ln1_g, *ln1_b, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
    Param<T>*ln2_g, *ln2_b, *w1, *b1, *w2, *b2;
    Mat<T> ln1, q, k, v, att, ln2, h, g; // saved activations
    Vec<T> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
    Tensor4<T> probs;
  };

  Param<T>& add(const std::string& name, std::vector<std::int64_t> shape, double std_dev,
                double fill);
  void forward(const ExecSpace& exec);
  void backward(const ExecSpace& exec);

  io::ModelConfig config_;
  int batch_;
  std::uint64_t seed_;
  std::vector<Param<T>> params_;
  std::vector<Layer> layers_;
  Param<T>*wte_, *wpe_, *lnf_g_, *lnf_b_;
  std::vector<std::int32_t> host_inputs_;
  kernels::Tokens inputs_, targets_;
  std::vector<Mat<T>> stream_; // residual stream: 2L + 1 states
  Mat<T> lnf_, logits_;
  Vec<T> lnf_mean_, lnf_rstd_, losses_;
  // backward scratch
  Mat<T> dx_, dln_, da_, dq_, dk_, dv_, dh_, dg_;
  Tensor4<T> dscratch_;
  kernels::AttentionWorkspace<T> attn_work_; // shared by all layers
};

} // namespace cubelm::model
