// The tensor modes' buffers (tp/buffers.hpp), one case per mode.

#include "cubelm/tp/buffers.hpp"

#include "cubelm/tp/shapes.hpp"

#include "buffer_names.hpp"

#include <algorithm>
#include <map>

namespace cubelm::tp {

namespace {

bool sequence_parallel(const comm::Layout& layout) {
  return comm::splits_sequences(layout.mode) && layout.sequence_parallel && layout.tp > 1;
}

// The buffers of a vector parameter of `n` features (parts.hpp's Shared) as each mode
// shares it: `column` is a bias of a pair's first linear.
//  - 1d: a column bias is split with its linear's columns and needs nothing; the others
//    are replicated, with sequence parallelism summing partial gradients over the group;
//  - 2d: block n / q of the row, split again over the column (gathered block, partial
//    gradient, reduce-scattered piece);
//  - 3d: block n / q, replicated over a plane of q^2 ranks that sum partial gradients.
void add_vector(Buffers& out, const comm::Layout& layout, std::int64_t n, bool column) {
  using namespace detail::own;
  const std::int64_t q = layout.side();
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    if (!column && sequence_parallel(layout))
      out.push_back({kPartial, n, Holds::compute});
    return;
  case TensorMode::d2:
    out.insert(out.end(), {{kGathered, n / q},
                           {kPartial, n / q, Holds::compute},
                           {kPiece, n / (q * q), Holds::compute}});
    return;
  case TensorMode::d3:
    if (q > 1)
      out.push_back({kPartial, n / q, Holds::compute});
    return;
  }
}

} // namespace

Buffers linear_scratch(const comm::Layout& layout, std::int64_t in, std::int64_t out,
                       std::int64_t rows, bool second) {
  const std::int64_t q = layout.side();
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    if (second && sequence_parallel(layout))
      return {{detail::d1::kFull, rows * out}};
    return {};
  case TensorMode::d2: {
    const std::int64_t bi = in / q, bo = out / q;
    using namespace detail::d2;
    return {{kAct, rows * bi},
            {kWeight, bi * bo},
            {kPartial, rows * bi},
            {kWeightPartial, bi * bo, Holds::compute},
            {kWeightSum, bi * bo, Holds::compute}};
  }
  case TensorMode::d3: {
    const std::int64_t wr = in / (q * q), wc = out / q;
    using namespace detail::d3;
    return {{kInput, rows * q * (in / q)},
            {kWeight, (in / q) * wc},
            {kOutput, rows * q * wc},
            {kInputGrad, rows * q * (in / q)},
            {kWeightGrad, (in / q) * wc, Holds::compute},
            {kWeightBlock, wr * wc, Holds::compute}};
  }
  }
  return {};
}

Buffers layernorm_scratch(const comm::Layout& layout, std::int64_t features, std::int64_t rows) {
  if (sequence_parallel(layout))
    return {{detail::d1::kLocal, rows * features}};
  return {};
}

Buffers embedding_scratch(const comm::Layout& layout, bool lookup, bool head, int batch,
                          std::int64_t positions, std::int64_t hidden, std::int64_t padded) {
  const std::int64_t q = layout.side(), all = static_cast<std::int64_t>(batch) * positions;
  Buffers out;
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    if (lookup && sequence_parallel(layout))
      out.push_back({detail::d1::kFull, all * hidden});
    break;
  case TensorMode::d2: {
    using namespace detail::d2;
    const std::int64_t bv = padded / q, bh = hidden / q;
    const std::int64_t rows = static_cast<std::int64_t>(batch / q) * positions;
    if (lookup)
      out.push_back({kPartial, all * bh});
    if (head)
      out.insert(out.end(), {{kPartial, rows * bv},
                             {kWeight, bv * bh},
                             {kAct, rows * bv},
                             {kWeightPartial, bv * bh, Holds::compute},
                             {kWeightSum, bv * bh, Holds::compute}});
    break;
  }
  case TensorMode::d3: {
    using namespace detail::d3;
    const std::int64_t bv = padded / q, bh = hidden / q;
    const std::int64_t rows = static_cast<std::int64_t>(batch / (q * q)) * positions;
    out.push_back({kWeightBlock, (bv / q) * bh, Holds::compute});
    if (lookup)
      out.insert(out.end(), {{kInput, rows * q * bh}, {kOutput, rows * q * bh}});
    if (head)
      out.insert(out.end(),
                 {{kInput, rows * q * bh}, {kOutput, rows * q * bv}, {kInputGrad, rows * q * bh}});
    break;
  }
  }
  return out;
}

Buffers linear_owned(const comm::Layout& layout, std::int64_t out, int biases, bool second) {
  Buffers owned;
  for (int b = 0; b < biases; ++b)
    add_vector(owned, layout, out, !second);
  return owned;
}

Buffers layernorm_owned(const comm::Layout& layout, std::int64_t features, std::int64_t rows) {
  Buffers owned{{detail::own::kLnSums, 2 * rows, Holds::compute}};
  add_vector(owned, layout, features, false); // beta
  add_vector(owned, layout, features, false); // gamma
  return owned;
}

Buffers embedding_owned(const comm::Layout& layout, bool lookup, bool head, int batch,
                        std::int64_t positions, std::int64_t seq_len, std::int64_t hidden,
                        std::int64_t padded) {
  using namespace detail::own;
  const ActivationSplit split = activation_split(layout);
  const std::int64_t q = layout.side(), all = static_cast<std::int64_t>(batch) * positions;
  // The head's rows and vocabulary slice: the mode's rows of the micro-batch, and the
  // vocabulary over p ranks (1d) or over q (2d, 3d: a row of the grid, an axis of the cube).
  const std::int64_t rows = all / split.sequences;
  const std::int64_t slice = layout.mode == TensorMode::d2 || layout.mode == TensorMode::d3
                                 ? padded / q
                                 : padded / layout.tp;
  Buffers owned;
  if (layout.mode == TensorMode::d3)
    owned.insert(owned.end(), {{kWteGathered, (padded / q) * (hidden / q)},
                               {kWteGrad, (padded / q) * (hidden / q), Holds::compute}});
  if (lookup) {
    // The ids each rank looks up: all of the micro-batch's (1d, 2d), or its rows' for
    // every feature block (3d). 3d sums the gradient of its block of wpe (every position,
    // hidden / q features) over the q ranks of an axis.
    owned.push_back({kTokens, layout.mode == TensorMode::d3 ? rows * q : all, Holds::ids});
    if (layout.mode == TensorMode::d3 && q > 1)
      owned.push_back({kPartial, seq_len * (hidden / q), Holds::compute});
  }
  if (head)
    owned.insert(owned.end(), {{kLogits, rows * slice},
                               {kTargets, rows, Holds::ids},
                               {kLossStats, 2 * rows, Holds::compute},
                               {kLossMax, rows, Holds::compute},
                               {kLosses, rows, Holds::compute}});
  return owned;
}

namespace {

// The layout's tensor group holds the same rows on `c` ranks (1d: all of them; 2d, 3d: a
// row of the grid, an axis of the cube), which route equal shares of them.
bool feature_blocks(const comm::Layout& layout) {
  return layout.mode == TensorMode::d2 || layout.mode == TensorMode::d3;
}

// What make_moe (src/tp/moe.cpp) builds: the rows the inner MoE routes, whether the
// tensor ranks share its router, its experts' hidden width.
struct MoeArrangement {
  std::int64_t routed = 0, share = 0, ffn = 0;
  bool router_summed = false, expert_tensor = false, replicated = false;
};

MoeArrangement arrange(const comm::Layout& layout, const MoeParts& m) {
  MoeArrangement a;
  a.routed = m.rows;
  a.ffn = 4 * m.hidden;
  if (layout.tp == 1)
    return a;
  const std::int64_t c = feature_blocks(layout) ? layout.side() : layout.tp;
  a.share = m.rows / c;
  if (layout.etp > 1) { // every rank routes the group's shares through its expert slices
    a.expert_tensor = true;
    a.routed = a.share * layout.tp;
    a.ffn = 4 * m.hidden / layout.tp;
    // 1d without sequence parallelism: the replicated rows are the group's already
    a.replicated = !feature_blocks(layout) && !sequence_parallel(layout);
  } else { // an expert-parallel MoE over the tensor ranks, each routing its share
    a.routed = a.share;
    a.router_summed = true;
  }
  return a;
}

} // namespace

Buffers moe_scratch(const comm::Layout& layout, const MoeParts& m) {
  using namespace detail::moe;
  const MoeArrangement a = arrange(layout, m);
  const std::int64_t h = m.hidden,
                     expert_rows = moe_rows(m.capacity_factor, a.routed, m.top_k, m.experts);
  Buffers out{{kLogitGrad, a.routed * m.experts, Holds::compute},
              {kGateGrad, a.routed * m.top_k, Holds::compute},
              {kExpertIn, expert_rows * h},
              {kExpertGrad, expert_rows * h}};
  const bool spread = layout.ep > 1 || a.router_summed;
  if (spread) {
    const std::int64_t received =
        moe_received_rows(m.capacity_factor, a.routed, m.top_k, m.experts, layout.ep);
    out.insert(out.end(), {{kHiddenGrad, received * a.ffn}, {kReceived, received * h}});
  } else {
    out.push_back({kHiddenGrad, expert_rows * a.ffn});
  }
  if (layout.tp == 1 || a.replicated)
    return out;
  if (a.expert_tensor)
    out.insert(out.end(),
               {{kGroupIn, a.routed * h}, {kGroupOut, a.routed * h}, {kGroupGrad, a.routed * h}});
  if (feature_blocks(layout)) {
    out.insert(out.end(), {{kShareIn, a.share * h},
                           {kShareOut, a.share * h},
                           {kShareGrad, a.share * h},
                           {kExchange, m.rows * (h / layout.side())}});
  } else {
    if (!sequence_parallel(layout))
      out.push_back({kShareOut, a.share * h});
    out.push_back({kShareGrad, a.share * h});
  }
  return out;
}

Buffers moe_owned(const comm::Layout& layout, const MoeParts& m) {
  using namespace detail::moe;
  const MoeArrangement a = arrange(layout, m);
  Buffers out{{kKeys, a.routed * m.top_k, Holds::ids}, {kProbMeans, m.experts, Holds::sums}};
  if (a.router_summed)
    out.push_back({kRouterPartial, m.hidden * m.experts, Holds::compute});
  return out;
}

Buffers moe_saved(const comm::Layout& layout, const MoeParts& m) {
  using namespace detail::moe;
  const MoeArrangement a = arrange(layout, m);
  const std::int64_t rows = moe_rows(m.capacity_factor, a.routed, m.top_k, m.experts), n = a.routed,
                     pairs = n * m.top_k;
  // With expert parallelism the experts here run on the rows they receive, else on all.
  const bool moved = layout.ep > 1;
  const std::int64_t run =
      moved ? moe_received_rows(m.capacity_factor, a.routed, m.top_k, m.experts, layout.ep) : rows;
  Buffers out{{kProbs, n * m.experts, Holds::compute},
              {kChoice, pairs, Holds::ids},
              {kGate, pairs, Holds::compute},
              {kSlot, pairs, Holds::ids},
              {kPairs, rows, Holds::ids},
              {kOffsets, m.experts + 1, Holds::ids},
              {kFraction, m.experts, Holds::compute},
              {kHidden, run * a.ffn},
              {kGelu, run * a.ffn},
              {kTanh, run * a.ffn},
              {kOut, rows * m.hidden}};
  if (moved)
    out.push_back({kInputs, run * m.hidden});
  return out;
}

Buffers attention_saved(int cp, int sequences, int heads, int local) {
  const AttentionBlocks cut = attention_blocks(cp, local);
  return {{detail::attn::kLse,
           cut.per_rank * static_cast<std::int64_t>(sequences) * heads * cut.length,
           Holds::compute}};
}

Buffers attention_buffers(int cp, int sequences, int heads, int local, int head_dim,
                          int value_bytes) {
  using namespace detail::attn;
  const AttentionBlocks cut = attention_blocks(cp, local);
  const std::int64_t n = static_cast<std::int64_t>(sequences) * heads, chunk = cut.length,
                     block = n * chunk * head_dim, kv = 2LL * cut.per_rank * block;
  // Attention computes on float blocks whatever the model stores (kernels/attention_blocks.hpp).
  Buffers out{{kKv, kv}, {kDkv, kv}};
  if (cp > 1) // every rank's blocks, gathered; on one rank they are its own
    out.insert(out.end(), {{kKvAll, cp * kv}, {kDkvAll, cp * kv}});
  out.insert(out.end(), {{kQ, block},
                         {kOut, block},
                         {kPart, block},
                         {kDout, block},
                         {kDq, block},
                         {kScores, n * chunk * chunk},
                         {kDscores, n * chunk * chunk},
                         {kPartLse, n * chunk},
                         {kDelta, n * chunk}});
  for (Buffer& b : out)
    b.holds = Holds::compute;
  if (cp > 1 && value_bytes < compute_bytes(value_bytes)) // messages in the stored type
    out.insert(out.end(), {{kKvSent, kv}, {kKvReceived, cp * kv}});
  return out;
}

namespace {

// The parts of a stage as the model builds them: add(scratch, owned, count) for each kind
// of part, `count` of them.
template <class Add>
void for_each_part(const comm::Layout& layout, const StageParts& p, Add add) {
  const ActivationSplit split = activation_split(layout);
  const std::int64_t rows = static_cast<std::int64_t>(p.batch / split.sequences) * p.positions;
  const std::int64_t stream = rows / split.stream_rows, h = p.hidden;
  const int dense = p.layers - p.moe_layers;
  add(layernorm_scratch(layout, h, stream), layernorm_owned(layout, h, stream),
      2 * p.layers + (p.last ? 1 : 0));
  add(linear_scratch(layout, h, h, rows, false), linear_owned(layout, h, 3, false),
      p.layers); // qkv
  add(linear_scratch(layout, h, h, rows, true), linear_owned(layout, h, 1, true),
      p.layers); // proj
  add(linear_scratch(layout, h, 4 * h, rows, false), linear_owned(layout, 4 * h, 1, false),
      dense); // fc1
  add(linear_scratch(layout, 4 * h, h, rows, true), linear_owned(layout, h, 1, true),
      dense); // fc2
  const MoeParts moe{rows, h, p.experts, p.top_k, p.capacity_factor};
  add(moe_scratch(layout, moe), moe_owned(layout, moe), p.moe_layers);
  if (p.first || p.last)
    add(embedding_scratch(layout, p.first, p.last, p.batch, p.positions, h, p.padded_vocab),
        embedding_owned(layout, p.first, p.last, p.batch, p.positions, p.seq_len, h,
                        p.padded_vocab),
        1);
}

} // namespace

BufferSizes stage_scratch_sizes(const comm::Layout& layout, const StageParts& parts) {
  BufferSizes largest;
  for_each_part(layout, parts, [&](const Buffers& scratch, const Buffers&, int count) {
    if (count > 0)
      for (const Buffer& b : scratch) {
        Buffer& at = largest.try_emplace(b.name, Buffer{b.name, 0, b.holds}).first->second;
        at.elements = std::max(at.elements, b.elements);
      }
  });
  return largest;
}

BufferSizes stage_owned_sizes(const comm::Layout& layout, const StageParts& parts) {
  BufferSizes sums;
  for_each_part(layout, parts, [&](const Buffers&, const Buffers& owned, int count) {
    for (const Buffer& b : owned)
      if (count > 0)
        sums.try_emplace(b.name, Buffer{b.name, 0, b.holds}).first->second.elements +=
            count * b.elements;
  });
  return sums;
}

std::string compare_buffers(const BufferSizes& allocated, const BufferSizes& described) {
  auto elements = [](const BufferSizes& sizes, std::string_view name) {
    const auto it = sizes.find(name);
    return it == sizes.end() ? std::int64_t(0) : it->second.elements;
  };
  auto check = [&](const BufferSizes& names) -> std::string {
    for (const auto& [name, b] : names) {
      const std::int64_t a = elements(allocated, name), d = elements(described, name);
      if (a != d)
        return std::string(name) + ": allocated " + std::to_string(a) + " elements, described " +
               std::to_string(d);
    }
    return "";
  };
  const std::string first = check(allocated);
  return first.empty() ? check(described) : first;
}

std::int64_t bytes_of(const Buffers& buffers, int value_bytes) {
  std::int64_t total = 0;
  for (const Buffer& b : buffers)
    total += bytes_of(b, value_bytes);
  return total;
}

std::int64_t bytes_of(const BufferSizes& sizes, int value_bytes) {
  std::int64_t total = 0;
  for (const auto& [name, b] : sizes)
    total += bytes_of(b, value_bytes);
  return total;
}

} // namespace cubelm::tp
