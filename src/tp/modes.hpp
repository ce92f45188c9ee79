#pragma once
// The factories of the tensor-parallel modes (one source file each). Internal to src/tp.

#include "cubelm/tp/mode.hpp"

#include <memory>

namespace cubelm::tp::detail {

template <class T>
std::unique_ptr<Mode<T>> make_1d(const comm::ProcessGrid& grid);
template <class T>
class Workspace;
/// The MoE feed-forward of a tensor-parallel group of one rank (moe.cpp): every expert
/// here, or with an expert-parallel group `ep` of more than one rank, its share of them;
/// `context`: the context-parallel group whose ranks share the sequences (or nullptr),
/// over which the load fractions are summed. Under 1d tensor parallelism (`tensor` of more
/// than one rank, which `ep` spans) each tensor rank routes an equal share of the `rows`
/// tokens; `split`: with sequence parallelism, the output is this rank's rows only. Under
/// 2d and 3d (`features`: the ranks that hold the same rows, each a block of the features)
/// the rows are exchanged over `features` into whole rows of an equal share per rank.
/// `expert_tensor`: expert tensor parallelism, each expert's hidden layer split over
/// `tensor`, whose ranks route the gathered shares alike (`ep` then spans replicas only).
template <class T>
std::unique_ptr<MoE<T>> make_moe(Params<T>& params, Workspace<T>& ws, const MoeNames& names,
                                 const MoeShape& shape, std::int64_t hidden, std::int64_t rows,
                                 double std_dev, double proj_std, std::uint64_t seed,
                                 const comm::Group* ep, const comm::Group* context,
                                 const comm::Group* tensor = nullptr, bool split = false,
                                 const comm::Group* features = nullptr, bool expert_tensor = false);
template <class T>
std::unique_ptr<Mode<T>> make_2d(const comm::ProcessGrid& grid);
template <class T>
std::unique_ptr<Mode<T>> make_3d(const comm::ProcessGrid& grid);

} // namespace cubelm::tp::detail
