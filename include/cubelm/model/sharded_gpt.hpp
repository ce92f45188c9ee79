#pragma once
/// \file
/// \brief GPT-2 written once against the tensor-parallel interface (tp/mode.hpp):
/// the same code runs single-process and under every mode.

#include "cubelm/core/config.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/tp/attention.hpp"
#include "cubelm/tp/mode.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace cubelm::model {

namespace detail {
class CollectiveCheck; // src/model/collective_check.hpp
}

using kernels::Mat;
using kernels::Vec;

/// \brief The model's shards on one rank of a tensor-parallel group, for the
/// layers of its pipeline stage.
///
/// `T` stores the activations, their gradients and the weights the kernels read: float
/// (training), double (finite-difference tests) or bf16 (train.precision = "bf16"), whose
/// master weights, gradients and statistics are float (compute_t, docs/precision.md).
///
/// A micro-batch's pass through a chunk keeps its activations in a slot (the
/// caller assigns slots: one per (micro-batch, chunk) in flight). The residual
/// stream between chunks is a matrix in the mode's layout: `input(slot)` is where
/// a chunk's input goes (received from the previous stage) and `output(chunk, slot)`
/// what its forward produced; backward reads the output's gradient from `output_grad()`
/// and leaves the input's gradient in `input_grad(slot)`.
template <class T>
class ShardedGPT {
public:
  /// \brief Registers this rank's parameter blocks and allocates activations for
  /// micro-batches of `batch` sequences (of which each activation holds mode.sequences(batch)).
  ShardedGPT(const ModelConfig& config, int batch, std::uint64_t seed, tp::Mode<T>& mode,
             cost::StageLayout stage = {});
  ~ShardedGPT();

  const ModelConfig& config() const { return config_; }
  const cost::StageLayout& stage() const { return stage_; }
  tp::Params<T>& params() { return params_; }
  const tp::Params<T>& params() const { return params_; }
  /// \brief This rank's block of the parameter called `name` (InternalError if none).
  tp::Param<T>& param(const std::string& name);
  /// \brief Bytes of this rank's parameters, gradients and activation buffers (the model's
  /// and the mode's), as allocated (the optimizer's moments belong to the trainer).
  cost::Memory memory() const;
  /// \brief Sequences of the micro-batch in each of this rank's activations.
  int sequences() const { return sequences_; }

  /// \brief Where the input of a chunk without the embedding goes, for `slot`.
  const Mat<T>& input(int slot) const;
  /// \brief The output of chunk `chunk`'s forward in `slot` (chunks without the head).
  const Mat<T>& output(int chunk, int slot) const;
  /// \brief Where the gradient of a chunk's output goes before its backward.
  const Mat<T>& output_grad() const { return dx_; }
  /// \brief The gradient of the chunk's input after the backward in `slot` (it
  /// replaces the input, which backward no longer needs).
  const Mat<T>& input_grad(int slot) const { return input(slot); }

  /// \brief Makes `buffer` the input of `slot` and returns the buffer it had, which
  /// something else (a send in flight) may still hold; an empty `buffer` is replaced by a
  /// new one of the input's shape ("cubelm::stream"). The pipeline stage pools them.
  Mat<T> replace_input(int slot, Mat<T> buffer);

  /// \brief Forward of local chunk `chunk` for the micro-batch in `slot`, enqueued on
  /// `exec` like backward (collectives and sends fence it); `inputs` (batch x seq_len ids,
  /// the whole micro-batch) is read by the embedding only.
  void forward(const ExecSpace& exec, int chunk, int slot, const std::vector<std::int32_t>& inputs);
  /// \brief Called after the gradient of a unit of parameters is complete for this
  /// pass: a layer (its id), the embedding (-1) or ln_f and the head (layers).
  using UnitDone = std::function<void(int unit)>;
  /// \brief Backward of local chunk `chunk` for `slot`, adding grad_scale x d(loss sum) to
  /// the gradients. The head's chunk computes the loss first (of `targets`) and returns
  /// its sum over the micro-batch (equal on the tensor-parallel group); others return 0.
  double backward(const ExecSpace& exec, int chunk, int slot,
                  const std::vector<std::int32_t>& inputs, const std::vector<std::int32_t>& targets,
                  double grad_scale, const UnitDone& done = nullptr);
  /// \brief The loss sum of the micro-batch in `slot` after the forward of the head's chunk.
  double loss(const ExecSpace& exec, int slot, const std::vector<std::int32_t>& targets);
  /// \brief For generation, after the forward of the head's chunk in `slot`: the logits of
  /// the one token whose mark is non-zero (`marks`: batch x seq_len, the whole
  /// micro-batch), over the real vocabulary, into `out` on every rank of the tensor (and
  /// context) group.
  void logits(const ExecSpace& exec, int slot, const std::vector<std::int32_t>& marks,
              const kernels::Vec<float>& out);

  /// \brief Forward and loss of a micro-batch through every chunk (a rank that holds the
  /// whole model: first and last, a slot per chunk; `inputs`, `targets`: batch x seq_len
  /// ids); returns the sum of the token losses (equal on the group). With grad_scale != 0
  /// also runs backward, adding grad_scale x d(loss sum) to the gradients.
  double forward_backward(const ExecSpace& exec, const std::vector<std::int32_t>& inputs,
                          const std::vector<std::int32_t>& targets, double grad_scale);
  void zero_grad();
  /// \brief After the master weights changed (an optimizer step, a checkpoint loaded): a
  /// bf16 model copies them into the bf16 weights its kernels read; nothing otherwise.
  void refresh_weights(const ExecSpace& exec);

  /// \brief The activation buffers this stage allocated, by name (cost/activations.hpp: the
  /// constructor checks them against cost::stage_activations).
  const tp::BufferSizes& activation_buffers() const { return buffers_; }

  /// \brief The load-balancing loss of the MoE layers (docs/model.md) that the forwards
  /// since the last call added up: the sum over micro-batches and MoE layers of N x aux
  /// (N the micro-batch's tokens this rank routes), so that divided by the tokens of the
  /// step it is the mean over micro-batches; resets it. 0 without MoE layers. Waits for
  /// the device.
  double take_aux_sum();

private:
  struct Layer;
  struct Acts;
  struct SlotBuffers; // the tensors of one activation slot
  // count_aux: add the MoE layers' auxiliary loss (not when backward re-runs a forward)
  void forward_layer(const ExecSpace& exec, Layer& y, Acts& a, const Mat<T>& x, const Mat<T>& x1,
                     const Mat<T>& x2, bool count_aux);
  void backward_layer(const ExecSpace& exec, Layer& y, Acts& a, const Mat<T>& x, const Mat<T>& x1,
                      double grad_scale);
  // mlp: the dense MLP's buffers; moe: an MoE layer's (after the layers are made)
  Acts make_acts(bool mlp, bool moe) const;
  // Records the activation buffers allocated (buffers_) and compares them with
  // cost::stage_activations.
  void check_buffers();
  Layer& layer(int id);
  int chunk_length(int chunk) const;
  // The tokens of `ids` (the whole micro-batch) that this rank holds: `ids` itself, or
  // with context parallelism its chunks of each sequence, copied into `buf`.
  const std::vector<std::int32_t>& local(const std::vector<std::int32_t>& ids,
                                         std::vector<std::int32_t>& buf) const;

  ModelConfig config_;
  tp::Mode<T>& mode_;
  cost::StageLayout stage_;
  int batch_, sequences_;
  kernels::Positions positions_; // of each sequence's tokens here
  // rows_: a pair's and a LayerNorm output's rows (inner); stream_rows_: the residual
  // stream's (Mode::outer_rows)
  std::int64_t rows_, stream_rows_, outer_, inner_, ffn_;
  tp::Params<T> params_;
  std::unique_ptr<tp::Embedding<T>> embedding_;
  std::vector<std::unique_ptr<Layer>> layers_; // this stage's layers, in model order
  std::vector<int> layer_ids_;
  std::unique_ptr<tp::LayerNorm<T>> lnf_;
  std::vector<std::unique_ptr<SlotBuffers>> slots_;
  std::unique_ptr<Acts> redo_;          // recompute: one layer's activations, re-made in backward
  Mat<T> redo_x1_, redo_x2_;            // recompute: the layer's inner residual state and output
  Kokkos::View<double*, MemSpace> aux_; // MoE load-balancing loss sum (take_aux_sum)
  Kokkos::View<double*, MemSpace>::host_mirror_type aux_host_; // its host copy
  Mat<T> d_outer_, dx_;
  Mat<T> dq_, dk_, dv_, da_, dh_, dg_;
  int heads_;
  // Attention on the block kernels (over the group's chunks with context parallelism),
  // and with context parallelism the local token ids of the micro-batch being run.
  std::unique_ptr<tp::BlockAttention<T>> attention_;
  std::vector<std::int32_t> local_inputs_, local_targets_;
  // The activation buffers allocated, by name (cost/activations.hpp; the names' storage).
  tp::BufferSizes buffers_;
  std::set<std::string, std::less<>> buffer_names_;
  // CUBELM_CHECK_COLLECTIVES: each piece's collectives against tp/collectives.hpp.
  std::unique_ptr<detail::CollectiveCheck> check_;
};

/// \brief A model together with the process grid and mode it runs on.
template <class T>
struct GridModel {
  /// \brief `layout` over the ranks of `comm`; `stage`: the part of the model this rank holds.
  GridModel(const ModelConfig& config, int batch, std::uint64_t seed, const comm::Layout& layout,
            const comm::Communicator& comm, cost::StageLayout stage = {});
  /// \brief The whole model on this rank alone (MPI_COMM_SELF): references and tools.
  static GridModel single(const ModelConfig& config, int batch, std::uint64_t seed);

  std::unique_ptr<comm::ProcessGrid> grid;
  std::unique_ptr<tp::Mode<T>> mode;
  std::unique_ptr<ShardedGPT<T>> model;
};

} // namespace cubelm::model
