#pragma once
/// \file
/// \brief Closed-form sizes of the GPT model of docs/model.md (no allocation).

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/tp/shapes.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cubelm::cost {

/// \brief Bytes of a stored value (an activation, its gradient, a message between
/// layers, the copy of a weight the kernels read) under `precision`: 2 under bf16, whose
/// model stores bfloat16, else 4. Master weights, gradients, the optimizer's moments and
/// statistics are 4 in every precision (docs/precision.md).
inline int value_bytes(Precision precision) {
  return precision == Precision::bf16 ? 2 : 4;
}

/// \brief Parameters of a dense transformer block: ln1, ln2 (2H each), wq/wk/wv/wo (H^2 + H
/// each), w1 (4H^2) + b1 (4H), w2 (4H^2) + b2 (H): 12 H^2 + 13 H.
inline std::int64_t parameters_per_layer(const ModelConfig& m) {
  const std::int64_t h = m.hidden;
  return 12 * h * h + 13 * h;
}

/// \brief Parameters of one expert (an MLP of the GPT-2 shape): 8 H^2 + 5 H.
inline std::int64_t parameters_per_expert(const ModelConfig& m) {
  const std::int64_t h = m.hidden;
  return 8 * h * h + 5 * h;
}

/// \brief Parameters of block `layer`: a dense block, or with an MoE feed-forward the
/// attention part, the router [H, E] and E experts.
inline std::int64_t parameters_of_layer(const ModelConfig& m, int layer) {
  if (!m.moe_layer(layer))
    return parameters_per_layer(m);
  const std::int64_t h = m.hidden, e = m.experts;
  return parameters_per_layer(m) - parameters_per_expert(m) + h * e + e * parameters_per_expert(m);
}

/// \brief Layers with an MoE feed-forward.
inline int moe_layer_count(const ModelConfig& m) {
  int n = 0;
  for (int l = 0; l < m.layers; ++l)
    n += m.moe_layer(l) ? 1 : 0;
  return n;
}

/// \brief All parameters: wte [V,H] (tied with the head), wpe [T,H], the blocks, ln_f.
inline std::int64_t parameter_count(const ModelConfig& m) {
  const std::int64_t h = m.hidden;
  std::int64_t blocks = 0;
  for (int l = 0; l < m.layers; ++l)
    blocks += parameters_of_layer(m, l);
  return static_cast<std::int64_t>(m.vocab_size) * h + static_cast<std::int64_t>(m.seq_len) * h +
         blocks + 2 * h;
}

/// \brief The parameters one token's forward uses: all but the E - top_k experts of every
/// MoE layer that it is not routed to.
inline std::int64_t active_parameter_count(const ModelConfig& m) {
  return parameter_count(m) - static_cast<std::int64_t>(moe_layer_count(m)) *
                                  (m.experts - m.top_k) * parameters_per_expert(m);
}

/// \brief The parameter names of transformer block `layer`, below /model (the checkpoint
/// schema of docs/training.md): the one place these names are spelled.
/// An MoE block has moe/router [H, E] and, for each global expert index e,
/// moe/experts/<e>/{w1, b1, w2, b2} in place of the MLP.
struct LayerParams {
  std::string ln1, ln2;                        ///< LayerNorm prefixes: <prefix>/gamma, /beta
  std::vector<std::string> qkv, qkv_bias;      ///< attn/wq, wk, wv and attn/bq, bk, bv
  std::string wo, bo, w1, b1, w2, b2;          ///< attention output; the MLP's two linears
  std::string router;                          ///< moe/router
  std::vector<std::string> ew1, eb1, ew2, eb2; ///< moe/experts/<e>/w1, b1, w2, b2
};
/// \brief The names of block `layer`; the expert names for `experts` experts.
inline LayerParams layer_params(int layer, int experts = 0) {
  const std::string p = "layers/" + std::to_string(layer) + "/";
  LayerParams n{p + "ln1",
                p + "ln2",
                {p + "attn/wq", p + "attn/wk", p + "attn/wv"},
                {p + "attn/bq", p + "attn/bk", p + "attn/bv"},
                p + "attn/wo",
                p + "attn/bo",
                p + "mlp/w1",
                p + "mlp/b1",
                p + "mlp/w2",
                p + "mlp/b2",
                p + "moe/router",
                {},
                {},
                {},
                {}};
  for (int e = 0; e < experts; ++e) {
    const std::string x = p + "moe/experts/" + std::to_string(e) + "/";
    n.ew1.push_back(x + "w1");
    n.eb1.push_back(x + "b1");
    n.ew2.push_back(x + "w2");
    n.eb2.push_back(x + "b2");
  }
  return n;
}

/// \brief One parameter of the model.
struct ParamEntry {
  std::string name;                ///< below /model
  std::vector<std::int64_t> shape; ///< global shape
  /// The unit whose backward completes the gradient: -1 the lookup (wte, wpe), l for
  /// layer l, `layers` for ln_f and the head.
  int unit = -1;
  bool tied = false; ///< wte: the lookup's table is also the head's weight
  int expert = -1;   ///< an MoE expert's tensor: its global expert index
};

/// \brief Every parameter of the model with its global shape, in a fixed order: wte, wpe,
/// the layers, ln_f.
inline std::vector<ParamEntry> parameter_table(const ModelConfig& m) {
  const std::int64_t h = m.hidden;
  std::vector<ParamEntry> all = {{"wte", {m.vocab_size, h}, -1, true}, {"wpe", {m.seq_len, h}}};
  for (int l = 0; l < m.layers; ++l) {
    const LayerParams n = layer_params(l);
    for (const std::string& ln : {n.ln1, n.ln2}) {
      all.push_back({ln + "/gamma", {h}, l});
      all.push_back({ln + "/beta", {h}, l});
    }
    for (const std::string& w : {n.qkv[0], n.qkv[1], n.qkv[2], n.wo})
      all.push_back({w, {h, h}, l});
    for (const std::string& b : {n.qkv_bias[0], n.qkv_bias[1], n.qkv_bias[2], n.bo})
      all.push_back({b, {h}, l});
    if (!m.moe_layer(l)) {
      all.push_back({n.w1, {h, 4 * h}, l});
      all.push_back({n.b1, {4 * h}, l});
      all.push_back({n.w2, {4 * h, h}, l});
      all.push_back({n.b2, {h}, l});
      continue;
    }
    const LayerParams x = layer_params(l, m.experts);
    all.push_back({x.router, {h, m.experts}, l});
    for (std::size_t e = 0; e < x.ew1.size(); ++e) {
      const int id = static_cast<int>(e);
      all.push_back({x.ew1[e], {h, 4 * h}, l, false, id});
      all.push_back({x.eb1[e], {4 * h}, l, false, id});
      all.push_back({x.ew2[e], {4 * h, h}, l, false, id});
      all.push_back({x.eb2[e], {h}, l, false, id});
    }
  }
  all.push_back({"ln_f/gamma", {h}, m.layers});
  all.push_back({"ln_f/beta", {h}, m.layers});
  return all;
}

/// \brief The names and global shapes of parameter_table.
inline std::vector<std::pair<std::string, std::vector<std::int64_t>>>
parameter_shapes(const ModelConfig& m) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> all;
  for (const ParamEntry& e : parameter_table(m))
    all.emplace_back(e.name, e.shape);
  return all;
}

/// \brief Model FLOPs per token for forward + backward: 6 N + 12 L H T
/// (6 per parameter, plus the q k^T and attention-times-v products of every layer); N
/// counts the parameters a token uses (active_parameter_count: top_k experts per MoE layer).
inline double flops_per_token(const ModelConfig& m) {
  return 6.0 * static_cast<double>(active_parameter_count(m)) +
         12.0 * m.layers * static_cast<double>(m.hidden) * m.seq_len;
}

/// \brief Bytes one rank holds, by kind.
struct Memory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer = 0;   ///< AdamW moments m and v
  std::int64_t activations = 0; ///< saved activations and backward buffers of one micro-batch
  /// host buffers of background checkpoints (checkpoint.async): the values and moments this
  /// rank writes, in float32. Host memory, so not in total(), which a device holds; a CPU
  /// run's admission check adds it.
  std::int64_t checkpoint_buffers = 0;
  /// host memory of the rank that writes checkpoints alone (checkpoint.writers = "one", or a
  /// job of one rank): the slabs of the file it assembles, their staging and the file
  /// driver's buffers (io::writer_buffer_bytes), while it saves. Host memory, as
  /// checkpoint_buffers.
  std::int64_t writer_slabs = 0;
  std::int64_t total() const { return parameters + gradients + optimizer + activations; }
};

/// \brief The part of the model one rank holds: its pipeline stage's chunks of layers.
struct StageLayout {
  /// Global layer ids of each local chunk, in model order; a chunk's layers are contiguous.
  std::vector<std::vector<int>> chunks;
  bool first = true;      ///< chunk 0 starts with the embedding lookup (virtual stage 0)
  bool last = true;       ///< the last chunk ends with ln_f, the tied head and the loss
  int slots = 1;          ///< activation sets: (micro-batch, chunk) pairs held at once
  bool recompute = false; ///< keep only each layer's input; re-run its forward in backward

  /// \brief All `layers` in one chunk, one slot: the whole model on one rank.
  static StageLayout whole(int layers) {
    StageLayout s;
    s.chunks.emplace_back();
    for (int l = 0; l < layers; ++l)
      s.chunks.back().push_back(l);
    return s;
  }
  /// \brief Layers of the longest chunk.
  int longest() const {
    std::size_t n = 0;
    for (const auto& c : chunks)
      n = std::max(n, c.size());
    return static_cast<int>(n);
  }
};

/// \brief What one pipeline stage holds, for sizing: its layers, its longest
/// chunk, its activation slots, and whether it has the lookup and the head.
struct StageShape {
  int layers = 0;  ///< layers on the stage (all chunks)
  int longest = 0; ///< layers of its longest chunk
  int slots = 1;   ///< activation sets held at once
  bool recompute = false;
  bool first = true;  ///< the embedding lookup (wte, wpe)
  bool last = true;   ///< ln_f and the tied head (wte)
  int moe_layers = 0; ///< layers with an MoE feed-forward (all chunks)
  /// activation positions of a slot (0 .. longest - 1, shared by the chunks) whose layer
  /// in some chunk has an MoE feed-forward (moe_acts), or a dense MLP (mlp_acts; -1: all)
  int moe_acts = 0;
  int mlp_acts = -1;
  int ep = 1; ///< expert parallelism: each rank holds experts / ep experts of an MoE layer
  /// expert tensor parallelism (1 or tp): each rank holds 1 / etp of an expert's hidden layer
  int etp = 1;
  int cp = 1; ///< context parallelism: each rank holds seq_len / cp tokens of a sequence
  /// \brief The whole model on one stage, one slot.
  static StageShape whole(const ModelConfig& m) {
    const int moe = moe_layer_count(m);
    return StageShape{m.layers, m.layers, 1, false, true, true, moe, moe, m.layers - moe};
  }
};

/// \brief Parameter elements on one rank of the tensor-parallel group (`tp` ranks in
/// `mode`, split as tp::param_split says; docs/tensor-parallel.md for the layouts) for
/// `stage`:
///  - none/1d (p = tp): per layer 12 H^2 / p + 7 H / p + 6 H; wte V H / p, wpe T H, ln_f 2 H:
///    vocabulary rows and weights split p ways; LayerNorms, wpe and the row-parallel
///    biases replicated;
///  - 2d (q^2 = tp): per layer (12 H^2 + 13 H) / q^2; wte V H / q^2, wpe T H / q (a hidden
///    block, replicated over the column), ln_f 2 H / q^2;
///  - 3d (q^3 = tp): per layer 12 H^2 / q^3 + 13 H / q; wte V H / q^3, wpe T H / q, ln_f
///    2 H / q: the weights fall as 1/q^3; vectors and wpe hold a feature chunk, replicated
///    over a plane.
/// wte is held by the first stage (lookup) and by the last (head), with V the padded
/// vocabulary (tp::padded_vocab).
inline std::int64_t parameters_per_rank(const ModelConfig& m, TensorMode mode, int tp,
                                        const StageShape& stage) {
  const std::int64_t h = m.hidden, v = tp::padded_vocab(m, comm::Layout{1, 1, tp, mode}),
                     t = m.seq_len;
  // A layer's block: 12 H^2 of weights, 7 H of column-parallel biases (bq, bk, bv, b1),
  // 6 H of other vectors (two LayerNorms, bo, b2); mlp: the MLP's part (W1, b1, W2, b2).
  const tp::ParamSplit split = tp::param_split(comm::Layout{1, 1, tp, mode});
  const std::int64_t layer = 12 * h * h / split.matrix + 7 * h / split.column_bias +
                             6 * h / split.vector,
                     wte = v * h / split.matrix, wpe = t * h / split.wpe,
                     lnf = 2 * h / split.vector,
                     mlp = 8 * h * h / split.matrix + 4 * h / split.column_bias + h / split.vector;
  // An MoE layer holds the router and its E / ep experts whole (ep spans the tp ranks),
  // or with expert tensor parallelism their slices (w1, b1, w2 split over the tp ranks, b2
  // whole), instead of its block of the MLP.
  const std::int64_t expert =
      stage.etp > 1 && tp > 1 ? 8 * h * h / tp + 4 * h / tp + h : parameters_per_expert(m);
  const std::int64_t moe =
      stage.moe_layers > 0 ? h * m.experts + (m.experts / stage.ep) * expert - mlp : 0;
  return stage.layers * layer + stage.moe_layers * moe + (stage.first || stage.last ? wte : 0) +
         (stage.first ? wpe : 0) + (stage.last ? lnf : 0);
}

/// \brief The same for the whole model on one stage.
inline std::int64_t parameters_per_rank(const ModelConfig& m, TensorMode mode, int tp) {
  return parameters_per_rank(m, mode, tp, StageShape::whole(m));
}

} // namespace cubelm::cost
