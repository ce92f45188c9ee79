#pragma once
/// \file
/// \brief A parameter tensor: its global name and shape, and the block this rank holds.

#include "cubelm/kernels/views.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::tp {

using kernels::Mat;
using kernels::Vec;

/// \brief One parameter (or this rank's block of it) with its gradient, flat row-major.
template <class T>
struct Param {
  std::string name;                 ///< global name = checkpoint path below /model
  std::vector<std::int64_t> shape;  ///< global logical shape: [rows, cols] or [n]
  std::vector<std::int64_t> offset; ///< global index of this rank's first element, per dimension
  std::vector<std::int64_t> local;  ///< shape of this rank's block
  Vec<T> value;                     ///< the weights of the block
  Vec<T> grad;                      ///< accumulated gradient of the block
  bool decay = false;               ///< weight decay applies (tensors of rank >= 2)
  bool writer = true;               ///< this rank writes the block to checkpoints (replicas do not)
  bool counted = true;              ///< this rank's block counts in the global gradient norm
  /// an MoE expert's tensor: replicated over the expert-data-parallel group (its gradient
  /// is reduced there, ProcessGrid::expert_dp) instead of over dp
  bool expert = false;
  /// trailing rows of `shape` that pad it (wte's padded vocabulary): zero, never stored
  std::int64_t padding_rows = 0;

  std::int64_t size() const { return value.extent(0); }
  /// \brief The block as a [rows, cols] matrix (rank-2 parameters only).
  Mat<T> mat() const { return Mat<T>(value.data(), local[0], local[1]); }
  Mat<T> grad_mat() const { return Mat<T>(grad.data(), local[0], local[1]); }
};

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
