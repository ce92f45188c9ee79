#pragma once
// Pieces every tensor-parallel mode is built from: the buffers a mode allocates
// (counted for memory accounting) and the base class that owns them, parameters
// shared by several ranks of the group, LayerNorm over features that may be split
// over ranks, the vocabulary-parallel cross-entropy, the members an Embedding
// keeps for each of its ends, and token selection. Internal to src/tp; the modes
// themselves are described in docs/tensor-parallel.md.

#include "buffer_names.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/layernorm.hpp"
#include "cubelm/kernels/loss.hpp"
#include "cubelm/kernels/optim.hpp"
#include "cubelm/tp/buffers.hpp"
#include "cubelm/tp/mode.hpp"
#include "modes.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubelm::tp::detail {

using kernels::Tokens;

/// The name of a scratch buffer: "<unit>/<buffer>" (e.g. "1d/full", "moe/expert_in"),
/// so that the buffers of the modes and of the MoE layers they hold never collide.
using ScratchName = std::string_view;

/// Buffers of a mode: those its parts keep (tp/buffers.hpp's "own" buffers, recorded by
/// name so that the mode can compare them with their description), and scratch buffers
/// shared by all layers (each is sized at construction to the largest request). Values
/// are the model's storage type T; the compute_ ones compute_t<T> (statistics, loss rows,
/// gradients: Holds::compute), float in a bf16 model.
template <class T>
class Workspace {
public:
  using G = compute_t<T>;
  Mat<T> matrix(ScratchName name, std::int64_t rows, std::int64_t cols) {
    return owned_matrix<T>(name, rows, cols, Holds::values);
  }
  Vec<T> vector(ScratchName name, std::int64_t n) {
    own(name, n, Holds::values);
    return Vec<T>(label(name), n);
  }
  Mat<G> compute_matrix(ScratchName name, std::int64_t rows, std::int64_t cols) {
    return owned_matrix<G>(name, rows, cols, Holds::compute);
  }
  Vec<G> compute_vector(ScratchName name, std::int64_t n) {
    own(name, n, Holds::compute);
    return Vec<G>(label(name), n);
  }
  Kokkos::View<double*, MemSpace> doubles(ScratchName name, std::int64_t n) {
    own(name, n, Holds::sums);
    return Kokkos::View<double*, MemSpace>(label(name), n);
  }
  Tokens tokens(ScratchName name, std::int64_t n) {
    own(name, n, Holds::ids);
    return Tokens(label(name), n);
  }
  /// Makes scratch buffer `name` hold at least `elements` of what it `holds` (values or
  /// compute; construction time only: views handed out earlier would dangle after a
  /// reallocation).
  void reserve(ScratchName name, std::int64_t elements, Holds holds = Holds::values) {
    if (holds == Holds::compute)
      grow(compute_scratch_, name, elements);
    else
      grow(scratch_, name, elements);
  }
  /// Every request of a part (tp/buffers.hpp), at construction time as reserve().
  void reserve_all(const Buffers& requests) {
    for (const Buffer& r : requests)
      reserve(r.name, r.elements, r.holds);
  }
  /// A rows x cols matrix over scratch buffer `name` of values.
  Mat<T> scratch(ScratchName name, std::int64_t rows, std::int64_t cols) const {
    return over(scratch_, name, rows, cols);
  }
  /// A rows x cols matrix over scratch buffer `name` of the compute type.
  Mat<G> compute_scratch(ScratchName name, std::int64_t rows, std::int64_t cols) const {
    return over(compute_scratch_, name, rows, cols);
  }
  std::int64_t bytes() const {
    std::int64_t total = 0;
    for (const auto& [name, b] : owned_)
      total += bytes_of(b, static_cast<int>(sizeof(T)));
    for (const auto& [name, s] : scratch_)
      total += static_cast<std::int64_t>(s.extent(0) * sizeof(T));
    for (const auto& [name, s] : compute_scratch_)
      total += static_cast<std::int64_t>(s.extent(0) * sizeof(G));
    return total;
  }
  /// What the parts allocated, summed by name.
  const BufferSizes& owned() const { return owned_; }
  /// The scratch buffers' sizes by name.
  BufferSizes scratch_sizes() const {
    BufferSizes sizes;
    for (const auto& [name, s] : scratch_)
      sizes.emplace(name, Buffer{name, static_cast<std::int64_t>(s.extent(0)), Holds::values});
    for (const auto& [name, s] : compute_scratch_)
      sizes.emplace(name, Buffer{name, static_cast<std::int64_t>(s.extent(0)), Holds::compute});
    return sizes;
  }

private:
  template <class E>
  using Scratches = std::map<std::string, Vec<E>, std::less<>>;

  static std::string label(ScratchName name) { return "cubelm::" + std::string(name); }
  template <class E>
  Mat<E> owned_matrix(ScratchName name, std::int64_t rows, std::int64_t cols, Holds holds) {
    own(name, rows * cols, holds);
    return Mat<E>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label(name)), rows, cols);
  }
  void own(ScratchName name, std::int64_t elements, Holds holds) {
    Buffer& b = owned_.try_emplace(name, Buffer{name, 0, holds}).first->second;
    CUBELM_ASSERT(b.holds == holds, "buffer " + std::string(name) + " allocated as two types");
    b.elements += elements;
  }
  template <class E>
  static void grow(Scratches<E>& map, ScratchName name, std::int64_t elements) {
    auto it = map.find(name);
    if (it == map.end())
      it = map.emplace(std::string(name), Vec<E>()).first;
    if (static_cast<std::int64_t>(it->second.extent(0)) < elements)
      it->second = Vec<E>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::scratch/" + std::string(name)),
          elements);
  }
  template <class E>
  static Mat<E> over(const Scratches<E>& map, ScratchName name, std::int64_t rows,
                     std::int64_t cols) {
    const auto it = map.find(name);
    CUBELM_ASSERT(it != map.end() && static_cast<std::int64_t>(it->second.extent(0)) >= rows * cols,
                  "scratch buffer " + std::string(name) + " was not reserved for " +
                      std::to_string(rows) + " x " + std::to_string(cols));
    return Mat<E>(it->second.data(), rows, cols);
  }

  BufferSizes owned_; // names are the string constants of buffer_names.hpp and moe_*.hpp
  Scratches<T> scratch_;
  Scratches<G> compute_scratch_;
};

/// What every mode has: the workspace its layers allocate from, and its byte count.
/// Built before the derived mode's members, which may hold references to it.
template <class T>
class ModeBase : public Mode<T> {
public:
  std::int64_t workspace_bytes() const final { return ws_.bytes(); }
  void check_buffers(const StageParts& parts) const final {
    const std::string owned =
        compare_buffers(ws_.owned(), stage_owned_sizes(this->layout(), parts));
    CUBELM_ASSERT(owned.empty(), std::string(this->name()) + " mode's own buffers: " + owned);
    const std::string scratch =
        compare_buffers(ws_.scratch_sizes(), stage_scratch_sizes(this->layout(), parts));
    CUBELM_ASSERT(scratch.empty(), std::string(this->name()) + " mode's scratch: " + scratch);
  }

protected:
  explicit ModeBase(const comm::ProcessGrid& grid)
      : Mode<T>(grid), tensor_(grid.tp()), ep_(grid.layout().ep > 1 ? &grid.ep() : nullptr),
        expert_tensor_(grid.layout().etp > 1) {}
  /// The MoE placement every mode shares: its experts' group, the context group and,
  /// under tensor parallelism, the tensor group; the mode adds how its rows lie.
  MoePlacement moe_placement() const {
    MoePlacement p;
    p.ep = ep_;
    p.context = this->context();
    p.tensor = tensor_.size() > 1 ? &tensor_ : nullptr;
    p.expert_tensor = expert_tensor_;
    return p;
  }

  Workspace<T> ws_;
  const comm::Group& tensor_; // the whole tensor-parallel group
  const comm::Group* ep_;     // MoE layers' expert-parallel group (expert_size > 1)
  bool expert_tensor_;        // MoE layers' experts split over tensor_ (expert_tensor_size)
};

/// A parameter block as a tensor-parallel layer uses it (its weights as the kernels read
/// them, its gradient in the compute type). Three sharings:
///  - owned: no other rank of the group holds it;
///  - replicated over `replicas` (rank 0 of it writes and counts it); when `sum_over`
///    is given each rank computes a partial gradient that is all-reduced over it;
///  - split over `group`: a vector block cut again into group.size() contiguous pieces,
///    one per rank, all-gathered before use and its gradient reduce-scattered.
template <class T>
class Shared {
public:
  using G = compute_t<T>;
  static Shared owned(Params<T>& params, Param<T> p) {
    params.push_back(std::move(p));
    return Shared(&params.back());
  }
  static Shared replicated(Params<T>& params, Param<T> p, const comm::Group& replicas,
                           const comm::Group* sum_over, Workspace<T>& ws,
                           ScratchName partial = own::kPartial) {
    p.writer = replicas.rank() == 0;
    p.counted = replicas.rank() == 0;
    params.push_back(std::move(p));
    Shared s(&params.back());
    if (sum_over != nullptr && sum_over->size() > 1) {
      s.sum_ = sum_over;
      s.partial_ = ws.compute_vector(partial, s.p_->size());
    }
    return s;
  }
  /// Elements [first, first + n) of the vector `name` of length `length`, split over `group`.
  static Shared split(Params<T>& params, const std::string& name, std::int64_t length,
                      std::int64_t first, std::int64_t n, double fill, std::uint64_t seed,
                      const comm::Group& group, Workspace<T>& ws) {
    const std::int64_t piece = n / group.size();
    CUBELM_ASSERT(piece * group.size() == n, name + ": block does not split over " + group.name());
    params.push_back(
        make_param<T>(name, {length}, {first + group.rank() * piece}, {piece}, 0, fill, seed));
    Shared s(&params.back());
    s.split_ = &group;
    s.full_ = ws.vector(own::kGathered, n);
    s.partial_ = ws.compute_vector(own::kPartial, n);
    s.piece_ = ws.compute_vector(own::kPiece, piece);
    return s;
  }

  Param<T>& param() const { return *p_; }
  /// Gathers the weights if split; returns the whole block.
  Vec<T> gather(const ExecSpace& exec) {
    if (split_ == nullptr)
      return p_->weights();
    split_->all_gather(exec, p_->weights(), full_);
    return full_;
  }
  /// The whole block as last gathered.
  Vec<T> values() const { return split_ == nullptr ? p_->weights() : full_; }
  /// Where this call's gradient accumulates; finish with reduce().
  const Vec<G>& grad(const ExecSpace& exec) {
    if (partial_.extent(0) == 0)
      return p_->grad;
    Kokkos::deep_copy(exec, partial_, G(0));
    return partial_;
  }
  Mat<G> grad_mat(const ExecSpace& exec) {
    return Mat<G>(grad(exec).data(), p_->local[0], p_->local[1]);
  }
  /// Adds this call's gradient to the parameter's.
  void reduce(const ExecSpace& exec) {
    if (split_ != nullptr) {
      split_->reduce_scatter(exec, partial_, piece_);
      add(exec, piece_, p_->grad);
    } else if (sum_ != nullptr) {
      sum_->all_reduce(exec, partial_);
      add(exec, partial_, p_->grad);
    }
  }

private:
  explicit Shared(Param<T>* p) : p_(p) {}
  static void add(const ExecSpace& exec, const Vec<G>& from, const Vec<G>& to) {
    kernels::add_inplace<G>(exec, Mat<G>(to.data(), to.extent(0), 1),
                            Mat<G>(from.data(), from.extent(0), 1));
  }

  Param<T>* p_;
  const comm::Group* sum_ = nullptr;
  const comm::Group* split_ = nullptr;
  Vec<T> full_;            // the gathered weights
  Vec<G> partial_, piece_; // gradients
};

/// LayerNorm of rows whose `features` columns may be split over the ranks of
/// `stats` (null: whole rows here). The row sum and then the centred squares are
/// all-reduced over `stats` forward, so the statistics are those of the
/// single-process two-pass algorithm; the two row sums of the backward pass once.
template <class T>
class SplitLayerNorm final : public LayerNorm<T> {
public:
  using G = compute_t<T>;
  SplitLayerNorm(Shared<T> gamma, Shared<T> beta, const comm::Group* stats, std::int64_t features,
                 std::int64_t rows, Workspace<T>& ws)
      : gamma_(gamma), beta_(beta), stats_(stats != nullptr && stats->size() > 1 ? stats : nullptr),
        features_(features), rows_(rows), sums_(ws.compute_matrix(own::kLnSums, rows, 2)) {}

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y,
               const Vec<G>& saved) override {
    const Vec<G> mean = part(saved, 0), rstd = part(saved, 1);
    kernels::row_sum<T>(exec, x, mean);
    if (stats_ != nullptr)
      stats_->all_reduce(exec, mean);
    kernels::row_centered_squares<T>(exec, x, mean, features_, rstd);
    if (stats_ != nullptr)
      stats_->all_reduce(exec, rstd);
    kernels::layernorm_normalize<T>(exec, x, features_, gamma_.gather(exec), beta_.gather(exec), y,
                                    mean, rstd);
  }
  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                const Vec<G>& saved) override {
    const Vec<G> mean = part(saved, 0), rstd = part(saved, 1);
    kernels::layernorm_backward_sums<T>(exec, dy, x, gamma_.values(), mean, rstd, sums_);
    if (stats_ != nullptr)
      stats_->all_reduce(exec, sums_);
    kernels::layernorm_backward_input<T>(exec, dy, x, gamma_.values(), mean, rstd, sums_, features_,
                                         dx);
    kernels::layernorm_backward_params<T>(exec, dy, x, mean, rstd, gamma_.grad(exec),
                                          beta_.grad(exec));
    gamma_.reduce(exec);
    beta_.reduce(exec);
  }

private:
  // Means (k = 0) or reciprocal standard deviations (k = 1) of the caller's buffer.
  Vec<G> part(const Vec<G>& saved, int k) const {
    CUBELM_ASSERT(saved.extent_int(0) == 2 * rows_,
                  "LayerNorm statistics buffer of " + std::to_string(saved.extent(0)) +
                      " elements, expected 2 x " + std::to_string(rows_));
    return Vec<G>(saved.data() + k * rows_, rows_);
  }

  Shared<T> gamma_, beta_;
  const comm::Group* stats_;
  std::int64_t features_, rows_;
  Mat<G> sums_;
};

/// Token ids on the device, filled from host vectors through a host buffer kept
/// from call to call (no allocation per micro-batch). The copy is queued on `exec`
/// after the kernels that read the previous ids. The buffer is pinned memory on CUDA
/// (PinnedHostSpace): the copy reads it when the stream gets to it, without a
/// staging copy by the driver; on CPUs it is the device buffer itself and the copy
/// does nothing.
class DeviceTokens {
public:
  explicit DeviceTokens(Tokens dev)
      : dev_(dev), host_(Kokkos::create_mirror_view(PinnedHostSpace(), dev)) {}
  const Tokens& set(const ExecSpace& exec, const std::vector<std::int32_t>& ids) {
    CUBELM_ASSERT(ids.size() == dev_.extent(0), "token count does not match the micro-batch");
    // The copy queued by the previous call may not have run yet, and it reads the host
    // buffer when it runs: refilling the buffer first would hand the new ids to the
    // kernels of the previous micro-batch. Waiting for the instance that queued it is
    // the simplest order that is right (the host waits for that instance's other queued
    // work too; an event recorded after the copy would wait for the copy alone).
    if (queued_) {
      queued_->fence();
      queued_.reset();
    }
    for (std::size_t i = 0; i < ids.size(); ++i)
      host_(i) = ids[i];
    Kokkos::deep_copy(exec, dev_, host_);
    if (host_.data() != dev_.data())
      queued_ = exec;
    return dev_;
  }
  const Tokens& view() const { return dev_; }

private:
  Tokens dev_;
  Kokkos::View<std::int32_t*, Kokkos::LayoutRight, PinnedHostSpace> host_;
  std::optional<ExecSpace> queued_; ///< the instance of a copy that may be pending
};

/// Vocabulary-parallel cross-entropy on logits [rows, slice] of the vocabulary slice
/// starting at `first`: the row maximum, then the sums of exponentials and the target
/// logit, are reduced over `vocab` (the ranks holding the other slices of the same
/// rows); the loss sum over rows is all-reduced over `rows` (the ranks holding the
/// other rows; null: none). Columns of tokens from `tokens` on pad the vocabulary and
/// are left out. With grad_scale != 0 the logits become the gradient.
template <class T>
class VocabLoss {
public:
  using G = compute_t<T>;
  VocabLoss(const comm::Group* vocab, const comm::Group* rows, std::int64_t n, int tokens,
            Workspace<T>& ws)
      : vocab_(vocab), rows_(rows), tokens_(tokens), targets_(ws.tokens(own::kTargets, n)),
        stats_(ws.compute_matrix(own::kLossStats, n, 2)), mx_(ws.compute_vector(own::kLossMax, n)),
        losses_(ws.compute_vector(own::kLosses, n)) {}

  double operator()(const ExecSpace& exec, const Mat<T>& logits, int first,
                    const std::vector<std::int32_t>& targets, G grad_scale) {
    const Tokens& tgt = targets_.set(exec, targets);
    const std::int64_t cols = logits.extent(1);
    const std::int64_t valid = std::clamp<std::int64_t>(tokens_ - first, 0, cols);
    if (vocab_ == nullptr || vocab_->size() == 1) {
      CUBELM_ASSERT(first == 0, "VocabLoss: a whole vocabulary starts at token 0");
      kernels::whole_vocab_cross_entropy<T>(exec, logits, tgt, valid, losses_, grad_scale);
    } else {
      kernels::row_max<T>(exec, logits, valid, mx_);
      vocab_->all_reduce(exec, mx_, comm::ReduceOp::max);
      kernels::row_sumexp_target<T>(exec, logits, mx_, tgt, first, valid, stats_);
      vocab_->all_reduce(exec, stats_);
      kernels::vocab_cross_entropy<T>(exec, logits, stats_, tgt, first, valid, losses_, grad_scale);
    }
    double sum = kernels::sum<G>(exec, losses_);
    if (rows_ != nullptr && rows_->size() > 1) {
      sum_(0) = sum;
      rows_->all_reduce(HostExecSpace(), sum_);
      sum = sum_(0);
    }
    return sum;
  }

  /// For generation: the logits of the rows whose mark is non-zero (the rows here, marked
  /// as targets are given to operator()), one row in the whole micro-batch, into `out`
  /// (the real vocabulary), the same on every rank of `vocab` and `rows`: each rank places
  /// its columns of the row if it holds the row, zeros elsewhere, and the sum over the
  /// ranks adds each value to zeros only, so the row arrives exactly.
  void capture(const ExecSpace& exec, const Mat<T>& logits, int first,
               const std::vector<std::int32_t>& marks, const Vec<float>& out) {
    const Tokens& marked = targets_.set(exec, marks);
    const std::int64_t valid =
        std::clamp<std::int64_t>(tokens_ - first, 0, static_cast<std::int64_t>(logits.extent(1)));
    Kokkos::deep_copy(exec, out, 0.0f);
    kernels::copy_marked_rows<T>(exec, logits, marked, first, valid, out);
    for (const comm::Group* g : {vocab_, rows_})
      if (g != nullptr && g->size() > 1)
        g->all_reduce(exec, out);
  }

private:
  const comm::Group *vocab_, *rows_;
  int tokens_; // the vocabulary without its padding
  DeviceTokens targets_;
  Kokkos::View<double*, Kokkos::HostSpace> sum_{"cubelm::loss_sum", 1};
  Mat<G> stats_;
  Vec<G> mx_, losses_;
};

/// The members of an Embedding that depend on its ends (Mode::embedding): wpe and the
/// token ids with a lookup, the logits and the loss with a head. wte, held for every
/// end and laid out differently in each mode, stays with the mode's Embedding.
template <class T>
struct EmbeddingEnds {
  std::optional<Shared<T>> wpe;
  std::optional<DeviceTokens> tokens;
  kernels::TokenIndexer index; ///< of the lookup's tokens, for the backward
  Mat<T> logits;
  std::optional<VocabLoss<T>> loss;

  /// The lookup end: wpe [seq, hidden] holding columns [first, first + cols) here,
  /// replicated over `replicas` (gradient summed over `sum_over`, as in
  /// Shared::replicated), and the device buffer for `ids` token ids.
  void lookup(Params<T>& params, int seq, std::int64_t hidden, std::int64_t first,
              std::int64_t cols, std::uint64_t seed, const comm::Group& replicas,
              const comm::Group* sum_over, std::int64_t ids, Workspace<T>& ws) {
    wpe.emplace(Shared<T>::replicated(
        params, make_param<T>("wpe", {seq, hidden}, {0, first}, {seq, cols}, 0.02, 0, seed),
        replicas, sum_over, ws));
    tokens.emplace(ws.tokens(own::kTokens, ids));
  }
  /// The head end: logits [n, slice] and their loss (`vocab`, `rows`, `tokens` as in
  /// VocabLoss).
  void head(const comm::Group* vocab, const comm::Group* rows, std::int64_t n, std::int64_t slice,
            int tokens, Workspace<T>& ws) {
    logits = ws.matrix(own::kLogits, n, slice);
    loss.emplace(vocab, rows, n, tokens, ws);
  }
};

/// Sequences [first, first + count) of a micro-batch of token ids (seq ids each).
inline std::vector<std::int32_t> sequences(const std::vector<std::int32_t>& tokens, int seq,
                                           int first, int count) {
  const auto begin = tokens.begin() + static_cast<std::ptrdiff_t>(first) * seq;
  CUBELM_ASSERT(static_cast<std::size_t>(first + count) * seq <= tokens.size(),
                "micro-batch has fewer sequences than the layout needs");
  return std::vector<std::int32_t>(begin, begin + static_cast<std::ptrdiff_t>(count) * seq);
}

/// Weight and bias names of a linear, checked to pair up.
inline void check_names(const std::vector<std::string>& weights,
                        const std::vector<std::string>& biases) {
  CUBELM_ASSERT(!weights.empty() && weights.size() == biases.size(),
                "a linear needs one bias per weight");
}

} // namespace cubelm::tp::detail
