#pragma once
// The factories of the tensor-parallel modes (one source file each). Internal to src/tp.

#include "cubelm/tp/mode.hpp"

#include <memory>

namespace cubelm::tp::detail {

template <class T>
std::unique_ptr<Mode<T>> make_1d(const comm::ProcessGrid& grid);
template <class T>
std::unique_ptr<Mode<T>> make_2d(const comm::ProcessGrid& grid);
template <class T>
std::unique_ptr<Mode<T>> make_3d(const comm::ProcessGrid& grid);

} // namespace cubelm::tp::detail
