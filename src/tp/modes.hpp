#pragma once
// The factories of the tensor-parallel modes (one source file each). Internal to src/tp.

#include "cubelm/tp/mode.hpp"

#include <cstdint>
#include <memory>

namespace cubelm::tp::detail {

template <class T>
std::unique_ptr<Mode<T>> make_1d(const comm::ProcessGrid& grid);
template <class T>
class Workspace;
/// Where an MoE feed-forward's tokens and experts live on this rank. Each mode fills one
/// (ModeBase::moe_placement holds what all modes share) and make_moe builds from it.
struct MoePlacement {
  /// The experts spread over this group when it has more than one rank (experts / ep
  /// each); else every expert is here.
  const comm::Group* ep = nullptr;
  /// The ranks sharing the sequences (context parallelism), over which the load
  /// fractions are summed; or nullptr.
  const comm::Group* context = nullptr;
  /// Tensor parallelism (more than one rank): each rank of it routes an equal share of
  /// the rows, through experts whose `ep` spans these ranks; or nullptr.
  const comm::Group* tensor = nullptr;
  /// 2d and 3d: the ranks that hold the other features of this rank's rows (2d: the row
  /// group, 3d: the C axis), over which the rows are exchanged into whole rows of a share.
  /// nullptr under 1d, where every rank of `tensor` holds whole rows.
  const comm::Group* features = nullptr;
  /// 1d with sequence parallelism: the output is this rank's block of the rows (the
  /// residual stream's layout), not all of them.
  bool sequence_parallel = false;
  /// Expert tensor parallelism: each expert's hidden layer sliced over `tensor`, whose
  /// ranks route the gathered shares alike (`ep` then spans replicas only).
  bool expert_tensor = false;
};

/// The sizes and the initialisation of an MoE feed-forward: `rows` local rows of `hidden`
/// features in (a LayerNorm's output), w1 drawn with std_dev, w2 with proj_std.
struct MoeSizes {
  std::int64_t hidden = 0, rows = 0;
  double std_dev = 0, proj_std = 0;
  std::uint64_t seed = 0;
};

/// The MoE feed-forward of `placement` (moe.cpp): its router and experts registered in
/// `params`, its scratch in `ws`.
template <class T>
std::unique_ptr<MoE<T>> make_moe(Params<T>& params, Workspace<T>& ws, const MoeNames& names,
                                 const MoeShape& shape, const MoeSizes& sizes,
                                 const MoePlacement& placement);
template <class T>
std::unique_ptr<Mode<T>> make_2d(const comm::ProcessGrid& grid);
template <class T>
std::unique_ptr<Mode<T>> make_3d(const comm::ProcessGrid& grid);

} // namespace cubelm::tp::detail
