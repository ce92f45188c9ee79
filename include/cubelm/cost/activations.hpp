#pragma once
/// \file
/// \brief The activation buffers of a pipeline stage, described once and without Kokkos:
/// the saved activations of each slot, the buffers a layer is re-run in under recomputation,
/// the backward's buffers and attention's workspace.
///
/// model::ShardedGPT allocates them under these names (Kokkos labels "cubelm::<name>") and,
/// when it builds a stage, compares what it allocated with stage_activations(), name by name,
/// so the description cannot drift from the runtime for any layout a run uses. The memory
/// estimate (activation_bytes) sums the same description and the mode's buffers
/// (tp/buffers.hpp).

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/tp/buffers.hpp"

#include <cstdint>
#include <string_view>

namespace cubelm::cost {

/// \brief The names of the stage's activation buffers. n rows of a micro-batch here, r rows of
/// the residual stream, ho and hi columns outside and inside a pair, f = 4 hi the MLP's.
namespace act {
/// A slot's residual stream [r, ho]: each layer's input and inner state and the chunk's output
/// (2c + 1), with recomputation the layers' inputs and the output (c + 1).
constexpr std::string_view kStream = "stream";
/// A layer's saved activations: the LayerNorms' outputs [n, ho] and row statistics [2 r],
/// q, k, v and attention's output [n, hi], the MLP's hidden layer, GELU and tanh [n, f]
/// (and attention's log-sum-exp, tp::attention_saved).
constexpr std::string_view kLn1 = "ln1", kLn2 = "ln2", kLn1Stats = "ln1_stats",
                           kLn2Stats = "ln2_stats", kQ = "q", kK = "k", kV = "v", kAtt = "att",
                           kHidden = "h", kGelu = "g", kTanh = "gelu_tanh";
/// The last stage's ln_f output [n, ho] and statistics [2 r].
constexpr std::string_view kLnf = "ln_f", kLnfStats = "ln_f_stats";
/// Recomputation: the re-run layer's two inner residual states [r, ho].
constexpr std::string_view kRedoX1 = "redo_x1", kRedoX2 = "redo_x2";
/// The backward's: the gradients of a LayerNorm output [n, ho], of the stream [r, ho], of q, k,
/// v and attention's output [n, hi], of the MLP's hidden layer before and after GELU [n, f].
constexpr std::string_view kDOuter = "d_outer", kDx = "dx", kDq = "dq", kDk = "dk", kDv = "dv",
                           kDa = "da", kDh = "dh", kDg = "dg";
} // namespace act

/// \brief What stage `layout` of model `m` holds, for sizing, with the deck's expert and
/// context parallelism of `par`: its layers, its longest chunk, which activation
/// positions serve MoE and dense layers.
StageShape stage_shape(const ModelConfig& m, const StageLayout& layout, const comm::Layout& par);

/// \brief The stage's activation buffers on one rank of `layout` for micro-batches of `micro`
/// sequences, by name (the model's own; the tensor mode's and attention's are tp/buffers.hpp's).
/// A layer saves attention's log-sum-exp (tp::attention_saved) and, in an MoE position,
/// tp::moe_saved's buffers.
tp::BufferSizes stage_activations(const ModelConfig& m, const comm::Layout& layout, int micro,
                                  const StageShape& stage);

/// \brief Activation bytes on one rank, values of `value_bytes`: stage_activations, the mode's
/// own buffers and scratch (tp::stage_owned_sizes, tp::stage_scratch_sizes) and attention's
/// blocks (tp::attention_buffers).
std::int64_t activation_bytes(const ModelConfig& m, const comm::Layout& layout, int micro,
                              const StageShape& stage, int value_bytes = 4);

} // namespace cubelm::cost
