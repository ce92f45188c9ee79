#include "cubelm/cost/activations.hpp"

#include "cubelm/tp/shapes.hpp"

namespace cubelm::cost {

StageShape stage_shape(const ModelConfig& m, const StageLayout& layout, const comm::Layout& par) {
  StageShape shape;
  for (const auto& chunk : layout.chunks)
    shape.layers += static_cast<int>(chunk.size());
  shape.longest = layout.longest();
  shape.slots = layout.slots;
  shape.recompute = layout.recompute;
  shape.first = layout.first;
  shape.last = layout.last;
  // Activation position i serves the i-th layer of every chunk: MoE buffers when one of
  // them is an MoE layer, the MLP's when one of them is dense.
  shape.mlp_acts = 0;
  for (int i = 0; i < shape.longest; ++i) {
    bool moe = false, mlp = false;
    for (const auto& chunk : layout.chunks)
      if (i < static_cast<int>(chunk.size()))
        (m.moe_layer(chunk[static_cast<std::size_t>(i)]) ? moe : mlp) = true;
    shape.moe_acts += moe ? 1 : 0;
    shape.mlp_acts += mlp ? 1 : 0;
  }
  for (const auto& chunk : layout.chunks)
    for (const int l : chunk)
      shape.moe_layers += m.moe_layer(l) ? 1 : 0;
  shape.ep = par.ep;
  shape.etp = par.etp;
  shape.cp = par.cp;
  return shape;
}

namespace {

// The layout a stage's buffers follow: the stage's expert and context parallelism, and
// sequence parallelism only where there are tensor ranks to split the stream over.
comm::Layout stage_split(comm::Layout layout, const StageShape& stage) {
  layout.sequence_parallel = layout.sequence_parallel && layout.tp > 1;
  layout.ep = stage.ep;
  layout.etp = stage.etp;
  layout.cp = stage.cp;
  return layout;
}

tp::StageParts stage_parts(const ModelConfig& m, const comm::Layout& layout, int micro,
                           const StageShape& stage) {
  return tp::StageParts{
      micro,        m.seq_len / stage.cp, m.seq_len,   m.hidden,   tp::padded_vocab(m, layout),
      stage.layers, stage.moe_layers,     stage.first, stage.last, m.experts,
      m.top_k,      m.capacity_factor};
}

} // namespace

tp::BufferSizes stage_activations(const ModelConfig& m, const comm::Layout& given, int micro,
                                  const StageShape& stage) {
  using namespace act;
  const comm::Layout layout = stage_split(given, stage);
  // The mode's split of a micro-batch (tp::activation_split): n rows inside a pair, r of the
  // residual stream, ho and hi columns, heads and whole sequences here; tl tokens of each.
  const tp::ActivationSplit split = tp::activation_split(layout);
  const std::int64_t h = m.hidden, t = m.seq_len, tl = t / stage.cp;
  const std::int64_t n = static_cast<std::int64_t>(micro / split.sequences) * tl,
                     r = n / split.stream_rows, ho = h / split.outer, hi = h / split.inner,
                     f = 4 * h / split.inner, heads = m.heads / split.heads,
                     seqs = micro / split.sequences;
  tp::BufferSizes sizes;
  auto add = [&](const tp::Buffer& b, std::int64_t count) {
    if (count > 0 && b.elements > 0)
      sizes.try_emplace(b.name, tp::Buffer{b.name, 0, b.holds}).first->second.elements +=
          count * b.elements;
  };
  const tp::MoeParts moe{n, h, m.experts, m.top_k, m.capacity_factor};
  // One layer's saved activations: attention's always, the MLP's and the MoE's where
  // `mlp`, `moe` (ShardedGPT::make_acts), `count` of them.
  auto layer = [&](bool mlp, bool moe_here, std::int64_t count) {
    for (const auto& name : {kLn1, kLn2})
      add({name, n * ho}, count);
    for (const auto& name : {kLn1Stats, kLn2Stats})
      add({name, 2 * r, tp::Holds::compute}, count);
    for (const auto& name : {kQ, kK, kV, kAtt})
      add({name, n * hi}, count);
    if (mlp)
      for (const auto& name : {kHidden, kGelu, kTanh})
        add({name, n * f}, count);
    if (moe_here)
      for (const tp::Buffer& b : tp::moe_saved(layout, moe))
        add(b, count);
    for (const tp::Buffer& b : tp::attention_saved(stage.cp, static_cast<int>(seqs),
                                                   static_cast<int>(heads), static_cast<int>(tl)))
      add(b, count);
  };
  const std::int64_t c = stage.longest, slots = stage.slots;
  const std::int64_t mlp_acts = stage.mlp_acts < 0 ? c : stage.mlp_acts;
  // Each slot: its residual stream, every position's activations (or none under
  // recomputation), and on the last stage ln_f's.
  add({kStream, (stage.recompute ? c + 1 : 2 * c + 1) * r * ho}, slots);
  if (!stage.recompute) {
    // Positions with a dense layer and an MoE one in some chunk hold both sets of buffers.
    layer(false, false, slots * c);
    for (const auto& name : {kHidden, kGelu, kTanh})
      add({name, n * f}, slots * mlp_acts);
    for (const tp::Buffer& b : tp::moe_saved(layout, moe))
      add(b, slots * stage.moe_acts);
  }
  if (stage.last) {
    add({kLnf, n * ho}, slots);
    add({kLnfStats, 2 * r, tp::Holds::compute}, slots);
  }
  // Recomputation: one layer's activations to re-run any layer of the stage in.
  if (stage.recompute && c > 0) {
    const bool any_dense = stage.moe_layers<stage.layers, any_moe = stage.moe_layers> 0;
    layer(any_dense, any_moe, 1);
    add({kRedoX1, r * ho}, 1);
    add({kRedoX2, r * ho}, 1);
  }
  // The backward's buffers, once.
  add({kDOuter, n * ho}, 1);
  add({kDx, r * ho}, 1);
  for (const auto& name : {kDq, kDk, kDv, kDa})
    add({name, n * hi}, 1);
  for (const auto& name : {kDh, kDg})
    add({name, n * f}, 1);
  return sizes;
}

std::int64_t activation_bytes(const ModelConfig& m, const comm::Layout& given, int micro,
                              const StageShape& stage, int value_bytes) {
  const comm::Layout layout = stage_split(given, stage);
  const tp::StageParts parts = stage_parts(m, layout, micro, stage);
  std::int64_t bytes = tp::bytes_of(stage_activations(m, layout, micro, stage), value_bytes) +
                       tp::bytes_of(tp::stage_owned_sizes(layout, parts), value_bytes) +
                       tp::bytes_of(tp::stage_scratch_sizes(layout, parts), value_bytes);
  const tp::ActivationSplit split = tp::activation_split(layout);
  const std::int64_t hi = m.hidden / split.inner, heads = m.heads / split.heads;
  bytes +=
      tp::bytes_of(tp::attention_buffers(stage.cp, micro / split.sequences, static_cast<int>(heads),
                                         static_cast<int>(parts.positions),
                                         static_cast<int>(hi / heads), value_bytes),
                   value_bytes);
  return bytes;
}

} // namespace cubelm::cost
