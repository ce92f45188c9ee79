#pragma once
// The factories of the tensor-parallel modes (one source file each). Internal to src/tp.

#include "cubelm/tp/mode.hpp"

#include <memory>

namespace cubelm::tp::detail {

template <class T>
std::unique_ptr<Mode<T>> make_1d(const comm::ProcessGrid& grid);
template <class T>
class Workspace;
/// The MoE feed-forward of a group of one rank (moe_local.cpp): every expert here.
template <class T>
std::unique_ptr<MoE<T>> make_local_moe(Params<T>& params, Workspace<T>& ws, const MoeNames& names,
                                       const MoeShape& shape, std::int64_t hidden,
                                       std::int64_t rows, double std_dev, double proj_std,
                                       std::uint64_t seed);
template <class T>
std::unique_ptr<Mode<T>> make_2d(const comm::ProcessGrid& grid);
template <class T>
std::unique_ptr<Mode<T>> make_3d(const comm::ProcessGrid& grid);

} // namespace cubelm::tp::detail
