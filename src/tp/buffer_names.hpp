#pragma once
// The names of the tensor modes' scratch buffers (Workspace::scratch), shared by the modes
// that use them (mode_1d.cpp, mode_2d.cpp, mode_3d.cpp) and by their description
// (scratch.cpp, tp/scratch.hpp). Internal to src/tp; no Kokkos.

#include <string_view>

namespace cubelm::tp::detail {

namespace d1 {
// Under sequence parallelism: kLocal, a LayerNorm's own rows: its output before the
// gather, its gradient after; kFull, N rows: a row-parallel output before the
// reduce-scatter, its gathered gradient, the lookup's partial rows, the gathered
// embedding gradient.
constexpr std::string_view kLocal = "1d/local", kFull = "1d/full";
} // namespace d1

namespace d2 {
// A broadcast activation block, a broadcast weight block, a partial product shaped like
// an activation, and two shaped like a weight block.
constexpr std::string_view kAct = "2d/act", kWeight = "2d/weight", kPartial = "2d/partial",
                           kWeightPartial = "2d/weight_partial", kWeightSum = "2d/weight_sum";
} // namespace d2

namespace d3 {
// Gathered input, gathered weight, gathered output (or its gradient), the input
// gradient's partial sum, a weight-shaped partial and its reduced block.
constexpr std::string_view kInput = "3d/input", kWeight = "3d/weight", kOutput = "3d/output",
                           kInputGrad = "3d/input_grad", kWeightGrad = "3d/weight_grad",
                           kWeightBlock = "3d/weight_block";
} // namespace d3

} // namespace cubelm::tp::detail
