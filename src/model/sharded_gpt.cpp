#include "cubelm/model/sharded_gpt.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/cost/activations.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/optim.hpp"

#include "collective_check.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

namespace cubelm::model {

namespace act = cost::act;

// A layer's modules (parameters live in params_).
template <class T>
struct ShardedGPT<T>::Layer {
  std::unique_ptr<tp::LayerNorm<T>> ln1, ln2;
  std::unique_ptr<tp::Linear<T>> qkv, proj, fc1, fc2;
  std::unique_ptr<tp::MoE<T>> moe; // in place of fc1 and fc2 in an MoE layer
};

// A layer's saved activations for one micro-batch (th: GELU's tanh; ln*: row statistics;
// h, g, th: the MLP's, empty where no layer using the buffers has one; moe: an MoE
// layer's routing and expert activations).
template <class T>
struct ShardedGPT<T>::Acts {
  Mat<T> ln1_out, q, k, v, att, ln2_out, h, g, th;
  Vec<compute_t<T>> ln1, ln2;
  kernels::Batch<compute_t<T>> lse; // attention's log-sum-exp of its query rows
  kernels::MoeSaved<T> moe;
};

// The buffers of one activation slot: one (micro-batch, chunk) in flight. Without recomputation the
// residual stream holds each layer's input and inner state and the chunk's output (2c + 1) and
// every layer's activations; with it, only the layers' inputs and the output (c + 1).
template <class T>
struct ShardedGPT<T>::SlotBuffers {
  std::vector<Mat<T>> stream;
  std::vector<Acts> acts;
  Mat<T> lnf_out;
  Vec<compute_t<T>> lnf;
};

namespace {
// The activation buffers are labelled "cubelm::<name>" with the names of cost/activations.hpp.
std::string label(std::string_view name) {
  return "cubelm::" + std::string(name);
}
template <class T>
Mat<T> matrix(std::string_view name, std::int64_t rows, std::int64_t cols) {
  return Mat<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label(name)), rows, cols);
}
template <class T>
Vec<T> vector(std::string_view name, std::int64_t n) {
  return Vec<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label(name)), n);
}
} // namespace

template <class T>
typename ShardedGPT<T>::Acts ShardedGPT<T>::make_acts(bool mlp, bool moe) const {
  Acts a;
  a.ln1_out = matrix<T>(act::kLn1, rows_, outer_);
  a.ln2_out = matrix<T>(act::kLn2, rows_, outer_);
  a.q = matrix<T>(act::kQ, rows_, inner_);
  a.k = matrix<T>(act::kK, rows_, inner_);
  a.v = matrix<T>(act::kV, rows_, inner_);
  a.att = matrix<T>(act::kAtt, rows_, inner_);
  if (mlp) {
    a.h = matrix<T>(act::kHidden, rows_, ffn_);
    a.g = matrix<T>(act::kGelu, rows_, ffn_);
    a.th = matrix<T>(act::kTanh, rows_, ffn_);
  }
  if (moe) {
    for (const auto& y : layers_)
      if (y->moe) {
        a.moe = y->moe->make_saved();
        break;
      }
  }
  a.ln1 = vector<compute_t<T>>(act::kLn1Stats, 2 * stream_rows_);
  a.ln2 = vector<compute_t<T>>(act::kLn2Stats, 2 * stream_rows_);
  a.lse = attention_->make_saved();
  return a;
}

template <class T>
ShardedGPT<T>::ShardedGPT(const ModelConfig& config, int batch, std::uint64_t seed,
                          tp::Mode<T>& mode, cost::StageLayout stage)
    : config_(config), mode_(mode), stage_(std::move(stage)), batch_(batch),
      sequences_(mode.sequences(batch)), positions_(mode.positions(config.seq_len)),
      heads_(mode.local_heads(config.heads)),
      check_(std::make_unique<detail::CollectiveCheck>(mode.traffic(), mode.layout(), config,
                                                       static_cast<double>(batch) *
                                                           mode.positions(config.seq_len).local,
                                                       static_cast<int>(sizeof(T)))) {
  if (stage_.chunks.empty()) // the default: every layer in one chunk
    stage_.chunks = cost::StageLayout::whole(config.layers).chunks;
  CUBELM_ASSERT(stage_.slots >= 1, "a stage needs at least one activation slot");
  // The mode splits every tensor evenly only for shapes that pass the deck's rule.
  const std::string uneven = tp::check_shapes(mode.layout(), config, batch);
  CUBELM_ASSERT(uneven.empty(), std::string(mode.name()) + " cannot split this model: " + uneven);
  const std::int64_t H = config.hidden, S = positions_.local, L = config.layers;
  rows_ = static_cast<std::int64_t>(sequences_) * S;
  stream_rows_ = mode.outer_rows(batch, positions_.local);
  outer_ = mode.outer_cols(H);
  inner_ = mode.inner_cols(H);
  ffn_ = mode.inner_cols(4 * H);
  const double std_dev = 0.02, proj_std = 0.02 / std::sqrt(2.0 * L);
  const tp::Ends ends = stage_.first && stage_.last ? tp::Ends::both
                        : stage_.first              ? tp::Ends::lookup
                                                    : tp::Ends::head;
  if (stage_.first || stage_.last)
    embedding_ = mode.embedding(params_, config.vocab_size,
                                static_cast<int>(tp::padded_vocab(config, mode.layout())),
                                positions_, H, batch, seed, ends);
  if (!stage_.first && stage_.last) {
    // The head's copy of the tied wte: the first stage writes and counts it.
    tp::Param<T>& wte = param("wte");
    wte.writer = false;
    wte.counted = false;
  }
  for (const auto& chunk : stage_.chunks)
    for (const int l : chunk) {
      CUBELM_ASSERT(l >= 0 && l < L && (layer_ids_.empty() || l > layer_ids_.back()),
                    "stage layers must be increasing ids below model.layers");
      layer_ids_.push_back(l);
      const cost::LayerParams n = cost::layer_params(l, config.moe_layer(l) ? config.experts : 0);
      auto y = std::make_unique<Layer>();
      y->ln1 = mode.layernorm(params_, n.ln1, H, stream_rows_);
      y->qkv = mode.linear(params_, n.qkv, n.qkv_bias, H, H, rows_, tp::Role::first, std_dev, seed);
      y->proj = mode.linear(params_, {n.wo}, {n.bo}, H, H, rows_, tp::Role::second, proj_std, seed);
      y->ln2 = mode.layernorm(params_, n.ln2, H, stream_rows_);
      if (config.moe_layer(l)) {
        const tp::MoeShape shape{config.experts, config.top_k, config.capacity_factor,
                                 config.aux_loss};
        y->moe = mode.moe(params_, tp::MoeNames{n.router, n.ew1, n.eb1, n.ew2, n.eb2}, shape, H,
                          rows_, std_dev, proj_std, seed);
      } else {
        y->fc1 =
            mode.linear(params_, {n.w1}, {n.b1}, H, 4 * H, rows_, tp::Role::first, std_dev, seed);
        y->fc2 =
            mode.linear(params_, {n.w2}, {n.b2}, 4 * H, H, rows_, tp::Role::second, proj_std, seed);
      }
      layers_.push_back(std::move(y));
    }
  if (stage_.last)
    lnf_ = mode.layernorm(params_, "ln_f", H, stream_rows_);
  int moe_layers = 0;
  for (const int l : layer_ids_)
    moe_layers += config.moe_layer(l) ? 1 : 0;
  mode.check_buffers(tp::StageParts{
      batch, positions_.local, config.seq_len, H, tp::padded_vocab(config, mode.layout()),
      static_cast<int>(layer_ids_.size()), moe_layers, stage_.first, stage_.last, config.experts,
      config.top_k, config.capacity_factor});
  attention_ = std::make_unique<tp::BlockAttention<T>>(
      mode.context(), sequences_, heads_, positions_.local, static_cast<int>(inner_ / heads_));
  const int c = stage_.longest();
  // Position i of a slot's activations serves the i-th layer of every chunk.
  std::vector<bool> mlp_at(static_cast<std::size_t>(c)), moe_at(static_cast<std::size_t>(c));
  bool any_mlp = false, any_moe = false;
  for (const auto& chunk : stage_.chunks)
    for (std::size_t i = 0; i < chunk.size(); ++i) {
      const bool moe = config.moe_layer(chunk[i]);
      (moe ? moe_at : mlp_at)[i] = true;
      (moe ? any_moe : any_mlp) = true;
    }
  for (int k = 0; k < stage_.slots; ++k) {
    auto slot = std::make_unique<SlotBuffers>();
    const int states = stage_.recompute ? c + 1 : 2 * c + 1;
    for (int i = 0; i < states; ++i)
      slot->stream.push_back(matrix<T>(act::kStream, stream_rows_, outer_));
    if (!stage_.recompute)
      for (std::size_t i = 0; i < static_cast<std::size_t>(c); ++i)
        slot->acts.push_back(make_acts(mlp_at[i], moe_at[i]));
    if (stage_.last) {
      slot->lnf_out = matrix<T>(act::kLnf, rows_, outer_);
      slot->lnf = vector<compute_t<T>>(act::kLnfStats, 2 * stream_rows_);
    }
    slots_.push_back(std::move(slot));
  }
  if (stage_.recompute && c > 0) {
    redo_ = std::make_unique<Acts>(make_acts(any_mlp, any_moe));
    redo_x1_ = matrix<T>(act::kRedoX1, stream_rows_, outer_);
    redo_x2_ = matrix<T>(act::kRedoX2, stream_rows_, outer_);
  }
  if (any_moe) {
    aux_ = Kokkos::View<double*, MemSpace>("cubelm::aux_loss", 1);
    aux_host_ = Kokkos::create_mirror_view(aux_);
  }
  d_outer_ = matrix<T>(act::kDOuter, rows_, outer_);
  dx_ = matrix<T>(act::kDx, stream_rows_, outer_);
  dq_ = matrix<T>(act::kDq, rows_, inner_);
  dk_ = matrix<T>(act::kDk, rows_, inner_);
  dv_ = matrix<T>(act::kDv, rows_, inner_);
  da_ = matrix<T>(act::kDa, rows_, inner_);
  dh_ = matrix<T>(act::kDh, rows_, ffn_);
  dg_ = matrix<T>(act::kDg, rows_, ffn_);
  check_buffers();
}

template <class T>
void ShardedGPT<T>::check_buffers() {
  auto add = [&](const auto& view) {
    using Value = typename std::decay_t<decltype(view)>::value_type;
    const std::string name = view.label();
    const std::string_view prefix = "cubelm::";
    if (view.span() == 0)
      return;
    CUBELM_ASSERT(name.compare(0, prefix.size(), prefix) == 0,
                  "an activation buffer without a cubelm label: '" + name + "'");
    const std::string_view key = *buffer_names_.insert(name.substr(prefix.size())).first;
    // What a buffer holds follows from its type; in a float model the compute type's
    // buffers are the values' (the same bytes).
    const tp::Holds holds = std::is_integral_v<Value>             ? tp::Holds::ids
                            : std::is_same_v<Value, T>            ? tp::Holds::values
                            : std::is_same_v<Value, compute_t<T>> ? tp::Holds::compute
                                                                  : tp::Holds::sums;
    buffers_.try_emplace(key, tp::Buffer{key, 0, holds}).first->second.elements +=
        static_cast<std::int64_t>(view.span());
  };
  auto add_acts = [&](const Acts& a) {
    for (const Mat<T>* m : {&a.ln1_out, &a.q, &a.k, &a.v, &a.att, &a.ln2_out, &a.h, &a.g, &a.th})
      add(*m);
    add(a.ln1);
    add(a.ln2);
    add(a.lse);
    a.moe.for_each_buffer(add);
  };
  for (const auto& slot : slots_) {
    for (const auto& m : slot->stream)
      add(m);
    for (const auto& a : slot->acts)
      add_acts(a);
    add(slot->lnf_out);
    add(slot->lnf);
  }
  if (redo_) {
    add_acts(*redo_);
    add(redo_x1_);
    add(redo_x2_);
  }
  for (const Mat<T>* m : {&d_outer_, &dx_, &dq_, &dk_, &dv_, &da_, &dh_, &dg_})
    add(*m);
  const std::string differs = tp::compare_buffers(
      buffers_, cost::stage_activations(config_, mode_.layout(), batch_,
                                        cost::stage_shape(config_, stage_, mode_.layout())));
  CUBELM_ASSERT(differs.empty(), "the stage's activation buffers: " + differs);
}

template <class T>
ShardedGPT<T>::~ShardedGPT() = default;

template <class T>
tp::Param<T>& ShardedGPT<T>::param(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name)
      return p;
  CUBELM_ASSERT(false, "no parameter called '" + name + "'");
  return params_.front();
}

template <class T>
cost::Memory ShardedGPT<T>::memory() const {
  cost::Memory mem;
  // The master weights and the gradients in the compute type; a bf16 model also keeps
  // the bf16 copy of the weights its kernels read.
  using G = compute_t<T>;
  const std::int64_t weight_bytes =
      static_cast<std::int64_t>(sizeof(G) + (std::is_same_v<T, G> ? 0 : sizeof(T)));
  for (const auto& p : params_) {
    mem.parameters += p.size() * weight_bytes;
    mem.gradients += p.size() * static_cast<std::int64_t>(sizeof(G));
  }
  mem.activations = tp::bytes_of(buffers_, static_cast<int>(sizeof(T))) + mode_.workspace_bytes() +
                    attention_->bytes();
  return mem;
}

template <class T>
void ShardedGPT<T>::zero_grad() {
  for (auto& p : params_)
    Kokkos::deep_copy(p.grad, compute_t<T>(0));
}

template <class T>
void ShardedGPT<T>::refresh_weights(const ExecSpace& exec) {
  for (auto& p : params_)
    tp::refresh_weights(exec, p); // nothing for float and double
}

template <class T>
typename ShardedGPT<T>::Layer& ShardedGPT<T>::layer(int id) {
  const auto it = std::lower_bound(layer_ids_.begin(), layer_ids_.end(), id);
  CUBELM_ASSERT(it != layer_ids_.end() && *it == id,
                "layer " + std::to_string(id) + " is not on this stage");
  return *layers_[static_cast<std::size_t>(it - layer_ids_.begin())];
}

template <class T>
int ShardedGPT<T>::chunk_length(int chunk) const {
  CUBELM_ASSERT(chunk >= 0 && chunk < static_cast<int>(stage_.chunks.size()),
                "chunk " + std::to_string(chunk) + " is not on this stage");
  return static_cast<int>(stage_.chunks[static_cast<std::size_t>(chunk)].size());
}

template <class T>
const std::vector<std::int32_t>& ShardedGPT<T>::local(const std::vector<std::int32_t>& ids,
                                                      std::vector<std::int32_t>& buf) const {
  if (positions_.cp == 1)
    return ids;
  const int seq = positions_.total(), here = positions_.local;
  const std::size_t sequences = ids.size() / static_cast<std::size_t>(seq);
  buf.resize(sequences * static_cast<std::size_t>(here));
  for (std::size_t b = 0; b < sequences; ++b)
    for (int t = 0; t < here; ++t)
      buf[b * here + t] = ids[b * seq + positions_.global(t)];
  return buf;
}

template <class T>
const Mat<T>& ShardedGPT<T>::input(int slot) const {
  CUBELM_ASSERT(slot >= 0 && slot < stage_.slots, "activation slot out of range");
  return slots_[static_cast<std::size_t>(slot)]->stream.front();
}

template <class T>
Mat<T> ShardedGPT<T>::replace_input(int slot, Mat<T> buffer) {
  CUBELM_ASSERT(slot >= 0 && slot < stage_.slots, "activation slot out of range");
  Mat<T>& front = slots_[static_cast<std::size_t>(slot)]->stream.front();
  if (buffer.data() == nullptr)
    buffer = matrix<T>(act::kStream, stream_rows_, outer_);
  CUBELM_ASSERT(buffer.extent(0) == front.extent(0) && buffer.extent(1) == front.extent(1),
                "an input buffer of another shape");
  std::swap(front, buffer);
  return buffer;
}

template <class T>
const Mat<T>& ShardedGPT<T>::output(int chunk, int slot) const {
  CUBELM_ASSERT(slot >= 0 && slot < stage_.slots, "activation slot out of range");
  const int c = chunk_length(chunk);
  return slots_[static_cast<std::size_t>(slot)]
      ->stream[static_cast<std::size_t>(stage_.recompute ? c : 2 * c)];
}

template <class T>
double ShardedGPT<T>::take_aux_sum() {
  if (aux_.extent(0) == 0)
    return 0.0;
  // On a host backend the mirror is aux_ itself: read it before it is reset.
  Kokkos::deep_copy(aux_host_, aux_);
  const double sum = aux_host_(0);
  Kokkos::deep_copy(aux_, 0.0);
  return sum;
}

template <class T>
void ShardedGPT<T>::forward_layer(const ExecSpace& exec, Layer& y, Acts& a, const Mat<T>& x,
                                  const Mat<T>& x1, const Mat<T>& x2, bool count_aux) {
  using namespace kernels;
  using tp::Pass;
  using tp::Piece;
  check_->begin();
  y.ln1->forward(exec, x, a.ln1_out, a.ln1);
  y.qkv->forward(exec, a.ln1_out, {a.q, a.k, a.v});
  attention_->forward(exec, a.q, a.k, a.v, a.lse, a.att);
  y.proj->forward(exec, a.att, {x1});
  add_inplace<T>(exec, x1, x);
  check_->end({{Piece::attention, Pass::forward}});
  check_->begin();
  y.ln2->forward(exec, x1, a.ln2_out, a.ln2);
  if (y.moe) {
    y.moe->forward(exec, a.ln2_out, x2, a.moe,
                   count_aux ? aux_ : Kokkos::View<double*, MemSpace>());
  } else {
    y.fc1->forward(exec, a.ln2_out, {a.h});
    gelu_forward<T>(exec, a.h, a.g, a.th);
    y.fc2->forward(exec, a.g, {x2});
  }
  add_inplace<T>(exec, x2, x1);
  check_->end({{y.moe ? Piece::moe : Piece::mlp, Pass::forward}});
}

// dx_ holds the gradient of the layer's output on entry and of its input on exit.
template <class T>
void ShardedGPT<T>::backward_layer(const ExecSpace& exec, Layer& y, Acts& a, const Mat<T>& x,
                                   const Mat<T>& x1, double grad_scale) {
  using namespace kernels;
  using tp::Pass;
  using tp::Piece;
  check_->begin();
  if (y.moe) {
    y.moe->backward(exec, a.ln2_out, dx_, d_outer_, a.moe, compute_t<T>(grad_scale));
  } else {
    y.fc2->backward(exec, a.g, {dx_}, dg_);
    gelu_backward<T>(exec, a.h, a.th, dg_, dh_);
    y.fc1->backward(exec, a.ln2_out, {dh_}, d_outer_);
  }
  y.ln2->backward(exec, x1, d_outer_, dx_, a.ln2);
  check_->end({{y.moe ? Piece::moe : Piece::mlp, Pass::backward}});
  check_->begin();
  y.proj->backward(exec, a.att, {dx_}, da_);
  attention_->backward(exec, a.q, a.k, a.v, a.att, a.lse, da_, dq_, dk_, dv_);
  y.qkv->backward(exec, a.ln1_out, {dq_, dk_, dv_}, d_outer_);
  y.ln1->backward(exec, x, d_outer_, dx_, a.ln1);
  check_->end({{Piece::attention, Pass::backward}});
}

template <class T>
void ShardedGPT<T>::forward(const ExecSpace& exec, int chunk, int slot,
                            const std::vector<std::int32_t>& inputs) {
  const int c = chunk_length(chunk);
  SlotBuffers& s = *slots_.at(static_cast<std::size_t>(slot));
  const bool embed = stage_.first && chunk == 0;
  const bool head = stage_.last && chunk + 1 == static_cast<int>(stage_.chunks.size());
  if (embed) {
    const std::size_t expected = static_cast<std::size_t>(batch_) * config_.seq_len;
    CUBELM_ASSERT(inputs.size() == expected, "the embedding needs the whole micro-batch: " +
                                                 std::to_string(expected) + " token ids");
    check_->begin();
    embedding_->forward(exec, local(inputs, local_inputs_), s.stream[0]);
    check_->end({{tp::Piece::lookup, tp::Pass::forward}, {tp::Piece::table, tp::Pass::forward}});
  }
  const auto& ids = stage_.chunks[static_cast<std::size_t>(chunk)];
  for (int i = 0; i < c; ++i) {
    Layer& y = layer(ids[static_cast<std::size_t>(i)]);
    if (stage_.recompute)
      forward_layer(exec, y, *redo_, s.stream[i], redo_x1_, s.stream[i + 1], true);
    else
      forward_layer(exec, y, s.acts[i], s.stream[2 * i], s.stream[2 * i + 1], s.stream[2 * i + 2],
                    true);
  }
  if (head) {
    check_->begin();
    lnf_->forward(exec, output(chunk, slot), s.lnf_out, s.lnf);
    check_->end({{tp::Piece::head, tp::Pass::forward}});
  }
}

template <class T>
double ShardedGPT<T>::loss(const ExecSpace& exec, int slot,
                           const std::vector<std::int32_t>& targets) {
  CUBELM_ASSERT(stage_.last, "the loss is computed on the stage with the head");
  const double sum = embedding_->loss(exec, slots_.at(static_cast<std::size_t>(slot))->lnf_out,
                                      local(targets, local_targets_), T(0), d_outer_);
  return sum;
}

template <class T>
void ShardedGPT<T>::logits(const ExecSpace& exec, int slot, const std::vector<std::int32_t>& marks,
                           const kernels::Vec<float>& out) {
  CUBELM_ASSERT(stage_.last, "the logits are computed on the stage with the head");
  embedding_->logits(exec, slots_.at(static_cast<std::size_t>(slot))->lnf_out,
                     local(marks, local_targets_), out);
  // With context parallelism one rank of the group holds the marked token: the others add 0.
  if (mode_.context() != nullptr && mode_.context()->size() > 1)
    mode_.context()->all_reduce(exec, out);
}

template <class T>
double ShardedGPT<T>::backward(const ExecSpace& exec, int chunk, int slot,
                               const std::vector<std::int32_t>& inputs,
                               const std::vector<std::int32_t>& targets, double grad_scale,
                               const UnitDone& done) {
  const int c = chunk_length(chunk);
  SlotBuffers& s = *slots_.at(static_cast<std::size_t>(slot));
  const bool embed = stage_.first && chunk == 0;
  const bool head = stage_.last && chunk + 1 == static_cast<int>(stage_.chunks.size());
  double sum = 0;
  if (head) {
    check_->begin();
    sum = embedding_->loss(exec, s.lnf_out, local(targets, local_targets_),
                           compute_t<T>(grad_scale), d_outer_);
    Kokkos::deep_copy(exec, dx_, T(0));
    lnf_->backward(exec, output(chunk, slot), d_outer_, dx_, s.lnf);
    // A stage without the lookup gathers the tied table and reduce-scatters its gradient here.
    if (stage_.first)
      check_->end({{tp::Piece::head, tp::Pass::backward}});
    else
      check_->end({{tp::Piece::head, tp::Pass::backward},
                   {tp::Piece::table, tp::Pass::forward},
                   {tp::Piece::table, tp::Pass::backward}});
    if (done)
      done(config_.layers);
  }
  const auto& ids = stage_.chunks[static_cast<std::size_t>(chunk)];
  for (int i = c; i-- > 0;) {
    const int id = ids[static_cast<std::size_t>(i)];
    Layer& y = layer(id);
    if (stage_.recompute) {
      forward_layer(exec, y, *redo_, s.stream[i], redo_x1_, redo_x2_, false);
      backward_layer(exec, y, *redo_, s.stream[i], redo_x1_, grad_scale);
    } else {
      backward_layer(exec, y, s.acts[i], s.stream[2 * i], s.stream[2 * i + 1], grad_scale);
    }
    if (done)
      done(id);
  }
  if (embed) {
    check_->begin();
    embedding_->backward(exec, local(inputs, local_inputs_), dx_);
    check_->end({{tp::Piece::lookup, tp::Pass::backward}, {tp::Piece::table, tp::Pass::backward}});
    if (done)
      done(-1);
  } else {
    Kokkos::deep_copy(exec, s.stream[0], dx_);
  }
  return sum;
}

template <class T>
double
ShardedGPT<T>::forward_backward(const ExecSpace& exec, const std::vector<std::int32_t>& inputs,
                                const std::vector<std::int32_t>& targets, double grad_scale) {
  const int n = static_cast<int>(stage_.chunks.size());
  CUBELM_ASSERT(stage_.first && stage_.last && stage_.slots >= n,
                "forward_backward needs the whole model on this rank and a slot per chunk");
  const std::size_t expected = static_cast<std::size_t>(batch_) * config_.seq_len;
  CUBELM_ASSERT(inputs.size() == expected && targets.size() == expected,
                "forward_backward needs the whole micro-batch: " + std::to_string(expected) +
                    " token ids");
  for (int k = 0; k < n; ++k) {
    if (k > 0)
      Kokkos::deep_copy(input(k), output(k - 1, k - 1));
    forward(exec, k, k, inputs);
  }
  if (grad_scale == 0.0)
    return loss(exec, n - 1, targets);
  double sum = 0;
  for (int k = n; k-- > 0;) {
    if (k + 1 < n)
      Kokkos::deep_copy(dx_, input_grad(k + 1));
    sum += backward(exec, k, k, inputs, targets, grad_scale);
  }
  return sum;
}

template <class T>
GridModel<T>::GridModel(const ModelConfig& config, int batch, std::uint64_t seed,
                        const comm::Layout& layout, const comm::Communicator& comm,
                        cost::StageLayout stage)
    : grid(std::make_unique<comm::ProcessGrid>(layout, comm)), mode(tp::make_mode<T>(*grid)),
      model(std::make_unique<ShardedGPT<T>>(config, batch, seed, *mode, std::move(stage))) {}

template <class T>
GridModel<T> GridModel<T>::single(const ModelConfig& config, int batch, std::uint64_t seed) {
  return GridModel(config, batch, seed, comm::Layout{},
                   comm::Communicator::duplicate(MPI_COMM_SELF));
}

template class ShardedGPT<float>;
template class ShardedGPT<double>;
template class ShardedGPT<bf16>;
template struct GridModel<float>;
template struct GridModel<double>;
template struct GridModel<bf16>;

} // namespace cubelm::model
