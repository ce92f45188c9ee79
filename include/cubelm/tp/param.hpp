#pragma once
/// \file
/// \brief A parameter tensor: its global name and shape, and the block this rank holds.

#include "cubelm/kernels/views.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace cubelm::tp {

using kernels::Mat;
using kernels::Vec;

/// \brief One parameter (or this rank's block of it) as the optimizer, the data-parallel
/// reductions and the checkpoints see it: its master weights and gradient in `M`, flat
/// row-major. Param<T> adds what the model's kernels read.
template <class M>
struct ParamBlock {
  std::string name;                 ///< global name = checkpoint path below /model
  std::vector<std::int64_t> shape;  ///< global logical shape: [rows, cols] or [n]
  std::vector<std::int64_t> offset; ///< global index of this rank's first element, per dimension
  std::vector<std::int64_t> local;  ///< shape of this rank's block
  Vec<M> value;                     ///< the (master) weights of the block
  Vec<M> grad;                      ///< accumulated gradient of the block
  bool decay = false;               ///< weight decay applies (tensors of rank >= 2)
  bool writer = true;               ///< this rank writes the block to checkpoints (replicas do not)
  /// this rank writes its run of the block's moments to checkpoints (MomentRun): the
  /// writer and its data-parallel replicas, which under ZeRO hold the moments in shards
  bool writes_moments = true;
  bool counted = true; ///< this rank's block counts in the global gradient norm
  /// an MoE expert's tensor: replicated over the expert-data-parallel group (its gradient
  /// is reduced there, ProcessGrid::expert_dp) instead of over dp
  bool expert = false;
  /// trailing rows of `shape` that pad it (wte's padded vocabulary): zero, never stored
  std::int64_t padding_rows = 0;

  std::int64_t size() const { return value.extent(0); }
  Mat<M> grad_mat() const { return Mat<M>(grad.data(), local[0], local[1]); }
};

/// \brief A parameter of a model that stores `T`: its master weights and gradient are
/// compute_t<T> (float for a bf16 model); the kernels read weights(), the master weights
/// themselves or, in a bf16 model, their bf16 copy, made by refresh_weights() whenever the
/// master weights change (docs/precision.md).
template <class T>
struct Param : ParamBlock<compute_t<T>> {
  using Master = compute_t<T>;
  Vec<T> copy; ///< a bf16 model's bf16 copy of `value` (empty where T is compute_t<T>)

  /// \brief The weights the kernels read: `value`, or the bf16 copy.
  Vec<T> weights() const {
    if constexpr (std::is_same_v<T, Master>)
      return this->value;
    else
      return copy;
  }
  /// \brief weights() as a [rows, cols] matrix (rank-2 parameters only).
  Mat<T> mat() const { return Mat<T>(weights().data(), this->local[0], this->local[1]); }
};

/// \brief Makes weights() hold the master weights again (a bf16 model: copies them rounded
/// to bfloat16, allocating the copy the first time); nothing where they are the same.
template <class T>
void refresh_weights(const ExecSpace& exec, Param<T>& p);

/// \brief N(0, 1) value of element `index` (row-major, global) of parameter `name`:
/// a counter-based generator (splitmix64 of seed, name hash and index, then Box-Muller),
/// so every layout initialises every element to the same value.
double init_normal(std::uint64_t seed, const std::string& name, std::int64_t index);

/// \brief A parameter block [offset, offset + local) of a tensor of global `shape`,
/// initialised to std_dev * init_normal(...) when std_dev > 0, else to `fill`; rows from
/// `stored_rows` on (when not negative) pad the tensor and are 0.
template <class T>
Param<T> make_param(const std::string& name, const std::vector<std::int64_t>& shape,
                    const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& local,
                    double std_dev, double fill, std::uint64_t seed, std::int64_t stored_rows = -1);

} // namespace cubelm::tp
