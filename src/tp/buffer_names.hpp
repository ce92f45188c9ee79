#pragma once
// The names of the tensor modes' buffers (Workspace::scratch, and the buffers a part keeps
// for itself), shared by the modes and parts that use them (mode_1d.cpp, mode_2d.cpp,
// mode_3d.cpp, parts.hpp) and by their description (buffers.cpp, tp/buffers.hpp).
// Internal to src/tp; no Kokkos.

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

// Buffers a part keeps for itself, any mode.
namespace own {
// A vector parameter (Shared): its gathered block when split, its partial gradient when
// split or summed over ranks, the reduce-scattered piece of it when split.
constexpr std::string_view kGathered = "vector/gathered", kPartial = "vector/partial",
                           kPiece = "vector/piece";
// A LayerNorm's two backward row sums per row.
constexpr std::string_view kLnSums = "ln/sums";
// The lookup's token ids; the head's logits; the cross-entropy's targets, per-row
// statistics (two per row), row maxima and losses.
constexpr std::string_view kTokens = "lookup/tokens", kLogits = "head/logits",
                           kTargets = "loss/targets", kLossStats = "loss/stats",
                           kLossMax = "loss/max", kLosses = "loss/losses";
// 3d: the embedding's gathered block of wte and its gradient.
constexpr std::string_view kWteGathered = "3d/wte_gathered", kWteGrad = "3d/wte_grad";
} // namespace own

// The MoE layers' (moe_router.hpp, moe_dispatch.hpp, moe_shares.hpp). Scratch, shared by
// the mode's MoE layers: the router logits' gradient [N, E] and the gates' gradient
// [N, k]; kExpertIn [R, H], the gathered expert inputs; kExpertGrad [R, H], the expert
// outputs' gradient, then the inputs'; kHiddenGrad [Rr, F], the hidden layer's gradient,
// before and after GELU; kReceived [Rr, H] (expert parallelism), the outputs of the rows
// run here, then their gradient and the inputs' gradient; kShareOut [N / p, H], this
// rank's share of the output (2d, 3d: then of the output's gradient); kShareGrad [N / p,
// H], the gradient of its share of the input; kShareIn [N / p, H] (2d, 3d), its share of
// the input; kExchange [R, H / c] (2d, 3d), blocks on their way to or from the feature
// group; kGroupIn, kGroupOut, kGroupGrad [N, H] (expert tensor parallelism): the tensor
// group's tokens, their partial output then the output's gradient, the input's partial
// gradient. A layer's own: the router's sort keys, probability means and, replicated over
// the tensor ranks, its partial gradient.
namespace moe {
constexpr std::string_view kLogitGrad = "moe/logit_grad", kGateGrad = "moe/gate_grad",
                           kExpertIn = "moe/expert_in", kExpertGrad = "moe/expert_grad",
                           kHiddenGrad = "moe/hidden_grad", kReceived = "moe/received",
                           kShareOut = "moe/share_out", kShareGrad = "moe/share_grad",
                           kShareIn = "moe/share_in", kExchange = "moe/exchange",
                           kGroupIn = "moe/group_in", kGroupOut = "moe/group_out",
                           kGroupGrad = "moe/group_grad";
constexpr std::string_view kKeys = "moe/keys", kProbMeans = "moe/prob_means",
                           kRouterPartial = "moe/router_partial";
// What a layer saves of a micro-batch (kernels::MoeSaved, whose labels spell these names):
// router probabilities [N, E], choices, gates and slots [N, k], each expert row's pair [R],
// the experts' row offsets [E + 1], load fractions [E], the hidden layer, GELU and its tanh
// [Rr, F], the outputs of this rank's pairs [R, H] and, with expert parallelism, the rows
// received for its experts [Rr, H].
constexpr std::string_view kProbs = "moe/probs", kChoice = "moe/choice", kGate = "moe/gate",
                           kSlot = "moe/slot", kPairs = "moe/pairs", kOffsets = "moe/offsets",
                           kFraction = "moe/fraction", kHidden = "moe/h", kGelu = "moe/g",
                           kTanh = "moe/gelu_tanh", kOut = "moe/out", kInputs = "moe/inputs";
} // namespace moe

// Attention (tp::BlockAttention), shared by a stage's layers: this rank's key and value
// blocks and their gradients [2 b, n, chunk, d] (b blocks of each sequence here); with
// context parallelism every rank's and their gradients [2 b cp, n, chunk, d]; one query
// block's q, output, partial output, output gradient and q gradient [n, chunk, d]; its
// scores and their gradient [n, chunk, chunk]; a partial log-sum-exp and the backward's row
// sums [n, chunk]. n: sequences x heads here.
namespace attn {
constexpr std::string_view kKv = "attention/kv", kKvAll = "attention/kv_all",
                           kDkvAll = "attention/dkv_all", kDkv = "attention/dkv",
                           kQ = "attention/q", kOut = "attention/out", kPart = "attention/part",
                           kDout = "attention/dout", kDq = "attention/dq",
                           kScores = "attention/scores", kDscores = "attention/dscores",
                           kPartLse = "attention/part_lse", kDelta = "attention/delta";
// What a layer saves of a micro-batch: the log-sum-exp of its query rows [b, n, chunk].
constexpr std::string_view kLse = "attention/lse";
// With context parallelism in a bf16 model: this rank's key and value blocks as sent and
// every rank's as received, in bf16 (the gradients travel back through the same buffers).
constexpr std::string_view kKvSent = "attention/kv_sent", kKvReceived = "attention/kv_received";
} // namespace attn

} // namespace cubelm::tp::detail
