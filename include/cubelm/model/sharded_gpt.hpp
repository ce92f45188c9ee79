#pragma once
/// \file
/// \brief GPT-2 written once against the tensor-parallel interface (tp/mode.hpp):
/// the same code runs single-process and under every mode.

#include "cubelm/io/deck.hpp"
#include "cubelm/kernels/attention.hpp"
#include "cubelm/model/shape.hpp"
#include "cubelm/tp/mode.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cubelm::model {

/// \brief The model's shards on one rank of a tensor-parallel group.
template <class T>
class ShardedGPT {
public:
  /// \brief Registers this rank's parameter blocks and allocates activations for
  /// micro-batches of `batch` sequences (of which each activation holds mode.sequences(batch)).
  ShardedGPT(const io::ModelConfig& config, int batch, std::uint64_t seed, tp::Mode<T>& mode);
  ~ShardedGPT();

  const io::ModelConfig& config() const { return config_; }
  tp::Params<T>& params() { return params_; }
  const tp::Params<T>& params() const { return params_; }
  /// \brief This rank's block of the parameter called `name` (InternalError if none).
  Param<T>& param(const std::string& name);
  /// \brief Bytes of this rank's parameters, gradients and activation buffers (the model's
  /// and the mode's), as allocated (the optimizer's moments belong to the trainer).
  Memory memory() const;
  /// \brief Sequences of the micro-batch in each of this rank's activations.
  int sequences() const { return sequences_; }

  /// \brief Forward and loss of a micro-batch (`inputs`, `targets`: batch x seq_len ids, the
  /// whole micro-batch on every rank of the group; each rank uses its share);
  /// returns the sum of the token losses of the whole micro-batch (equal on the group).
  /// With grad_scale != 0 also runs backward, adding grad_scale x d(loss sum) to the gradients.
  double forward_backward(const std::vector<std::int32_t>& inputs,
                          const std::vector<std::int32_t>& targets, double grad_scale);
  void zero_grad();

private:
  struct Layer;
  void backward(const ExecSpace& exec);

  io::ModelConfig config_;
  tp::Mode<T>& mode_;
  int batch_, sequences_;
  tp::Params<T> params_;
  std::unique_ptr<tp::Embedding<T>> embedding_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<tp::LayerNorm<T>> lnf_;
  std::vector<Mat<T>> stream_; // residual stream, 2L + 1 states
  Mat<T> lnf_out_, d_outer_, dx_;
  Mat<T> dq_, dk_, dv_, da_, dh_, dg_;
  kernels::Tensor4<T> dscratch_;
  kernels::AttentionWorkspace<T> work_;
  int heads_;
};

/// \brief A model together with the process grid and mode it runs on.
template <class T>
struct GridModel {
  /// \brief `layout` over the ranks of `comm`.
  GridModel(const io::ModelConfig& config, int batch, std::uint64_t seed,
            const comm::Layout& layout, const comm::Communicator& comm);
  /// \brief The whole model on this rank alone (MPI_COMM_SELF): references and tools.
  static GridModel single(const io::ModelConfig& config, int batch, std::uint64_t seed);

  std::unique_ptr<comm::ProcessGrid> grid;
  std::unique_ptr<tp::Mode<T>> mode;
  std::unique_ptr<ShardedGPT<T>> model;
};

} // namespace cubelm::model
