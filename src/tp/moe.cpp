// The MoE feed-forwards (docs/model.md for the semantics, docs/grid.md for expert
// parallelism):
//  - LocalMoE: the router and every expert on this rank; tokens never leave it.
//  - ExpertParallelMoE: the router here, experts / ep experts on each rank of the "ep"
//    group; the rows of the (token, expert) pairs travel to the rank of their expert and
//    back with all_to_all_v.
//  - TokenShareMoE (1d tensor parallelism): each tensor rank routes its share of the
//    tokens through an ExpertParallelMoE whose ep group spans the tensor ranks.
//  - FeatureShareMoE (2d, 3d): the same, each rank's share made whole rows by an
//    all_to_all over the ranks that hold the other features of its rows.
//  - ExpertTensorMoE (expert tensor parallelism): inside either, the shares gathered and
//    routed alike by every tensor rank through its slices of the experts; under 1d
//    without sequence parallelism ReplicatedExpertTensorMoE routes the replicated rows
//    directly and all-reduces the partial outputs.
//
// Forward: logits = x Wr, softmax and top-k (kernels::moe_route), the pairs sorted by
// expert into contiguous rows (moe_dispatch), the rows of x gathered, each expert's MLP
// run on its rows with ordinary gemms (ExpertBank), and the outputs combined with the
// gates. The expert matmuls' sizes are needed on the host: one small copy (E + 1 ints)
// from the device per layer and micro-batch (and, with expert parallelism, an all_to_all
// of E ints: the rows each rank receives for each expert).

#include "cubelm/kernels/moe.hpp"
#include "modes.hpp"
#include "moe_experts.hpp"

#include <optional>
#include <string>
#include <vector>

namespace cubelm::tp::detail {

namespace {

// Scratch buffers shared by all MoE layers of the mode (the modes' layers use 0 to 5).
enum MoeScratch : std::size_t {
  kExpertIn = 6,   // [R, H]: the gathered expert inputs
  kExpertGrad = 7, // [R, H]: the expert outputs' gradient, then the inputs'
  kHiddenGrad = 8, // [Rr, F]: the hidden layer's gradient, before and after GELU
  kLogitGrad = 9,  // [N, E]: the router logits' gradient
  kGateGrad = 10,  // [N, k]: the gates' gradient
  kReceived = 11,  // [Rr, H] (expert parallelism): the outputs of the rows run here, then
                   // their gradient and the inputs' gradient
  kShareOut = 12,  // [N / p, H] (tensor parallelism): this rank's share of the output (2d, 3d:
                   // then of the output's gradient)
  kShareGrad = 13, // [N / p, H] (tensor parallelism): the gradient of its share of the input
  kShareIn = 14,   // [N / p, H] (2d, 3d): its share of the input
  kExchange = 15,  // [R, H / c] (2d, 3d): blocks on their way to or from the feature group
  kGroupIn = 16,   // [N, H] (expert tensor parallelism): the tensor group's tokens
  kGroupOut = 17,  // [N, H] (expert tensor parallelism): their partial output, then the
                   // output's gradient
  kGroupGrad = 18  // [N, H] (expert tensor parallelism): the input's partial gradient
};

// The router and the routing: what both MoE feed-forwards share. When the micro-batch's
// tokens are shared out (`tensor`: the tensor-parallel ranks, each routing an equal share
// of the same tokens; `context`: the ranks sharing the sequences) the load fractions f_e
// are those of the whole micro-batch: s.fraction holds the sum of the shares (an
// all_reduce of E values per group, layer and micro-batch) and the loss's scales divide by
// the number of shares. Each rank adds N f_e P_e with its own P_e: summed over the shares
// that is the single process's N_all aux. Under tensor parallelism the router is
// replicated over `tensor` and its gradient, each rank's share's, summed over it.
// With expert tensor parallelism (`etp`: the tensor ranks, each holding a slice of every
// expert's hidden layer) every rank of `etp` routes the same tokens alike: the gates'
// gradient, partial sums of the slices, is all-reduced over it, the router's gradient is
// then the same everywhere (replicated, not summed), and the aux loss and the input's
// gradient through the router are counted on rank 0 of `etp` only.
template <class T>
class Router {
public:
  Router(Params<T>& params, Workspace<T>& ws, const MoeNames& names, const MoeShape& shape,
         std::int64_t hidden, std::int64_t rows, double std_dev, std::uint64_t seed,
         const comm::Group* tensor, const comm::Group* context, const comm::Group* etp = nullptr)
      : ws_(ws), shape_(shape), rows_(rows),
        etp_(etp != nullptr && etp->size() > 1 ? etp : nullptr),
        leader_(etp_ == nullptr || etp_->rank() == 0) {
    for (const comm::Group* g : {tensor, context})
      if (g != nullptr && g->size() > 1) {
        shares_groups_.push_back(g);
        shares_ *= g->size();
      }
    const std::int64_t e = shape.experts, h = hidden;
    CUBELM_ASSERT(static_cast<std::int64_t>(names.w1.size()) == e &&
                      names.b1.size() == names.w1.size() && names.w2.size() == names.w1.size() &&
                      names.b2.size() == names.w1.size(),
                  "an MoE layer needs four tensor names per expert");
    CUBELM_ASSERT(shape.top_k >= 1 && shape.top_k <= shape.experts,
                  "model.top_k must lie in [1, model.experts]");
    Param<T> router = make_param<T>(names.router, {h, e}, {0, 0}, {h, e}, std_dev, 0, seed);
    if (tensor != nullptr && tensor->size() > 1)
      router_.emplace(Shared<T>::replicated(params, std::move(router), *tensor, tensor, ws));
    else if (etp_ != nullptr)
      router_.emplace(Shared<T>::replicated(params, std::move(router), *etp_, nullptr, ws));
    else
      router_.emplace(Shared<T>::owned(params, std::move(router)));
    capacity_ = moe_capacity(shape.capacity_factor, rows, shape.top_k, shape.experts);
    keys_ = ws.tokens("cubelm::moe_keys", rows * shape.top_k);
    means_ = ws.doubles("cubelm::moe_prob_means", e);
    ws.reserve(kLogitGrad, rows * e);
    ws.reserve(kGateGrad, rows * shape.top_k);
  }

  // Routes x: probabilities, choices, gates, slots, the pairs sorted by expert and their
  // offsets, also on the host. Returns the rows used (pairs kept).
  std::int64_t route(const ExecSpace& exec, const Mat<T>& x, kernels::MoeSaved<T>& s) {
    using namespace kernels;
    gemm<T>(exec, false, false, T(1), x, router_->param().mat(), T(0), s.probs);
    moe_route<T>(exec, s.probs, s.choice, s.gate);
    moe_dispatch<T>(exec, s.choice, capacity_, keys_, sorter_, s.slot, s.pairs, s.offsets,
                    s.fraction);
    for (const comm::Group* g : shares_groups_)
      g->all_reduce(exec, s.fraction);
    Kokkos::deep_copy(exec, s.host_offsets, s.offsets);
    exec.fence(); // the expert matmuls' sizes
    return s.host_offsets(shape_.experts);
  }

  void aux_loss(const ExecSpace& exec, const kernels::MoeSaved<T>& s,
                const Kokkos::View<double*, MemSpace>& aux) {
    if (aux.extent(0) > 0 && shape_.aux_loss > 0 && leader_)
      kernels::moe_aux_loss<T>(
          exec, s.probs, s.fraction,
          shape_.aux_loss * shape_.experts * static_cast<double>(rows_) / shares_, means_, aux);
  }

  // The router's part of backward: from the gates' gradient (and the load-balancing
  // loss), the router's gradient and dx = dlogits Wr^T (assigned).
  void backward(const ExecSpace& exec, const Mat<T>& x, const kernels::MoeSaved<T>& s,
                const Mat<T>& dgate, const Mat<T>& dx, T grad_scale) {
    using namespace kernels;
    const Mat<T> dlogits = ws_.scratch(kLogitGrad, rows_, shape_.experts);
    if (etp_ != nullptr)
      etp_->all_reduce(exec, dgate);
    // d(N aux)/d p[t,e] = aux_loss E f_e (docs/model.md), scaled like the loss sum.
    const T aux_scale = static_cast<T>(shape_.aux_loss * shape_.experts / shares_) * grad_scale;
    moe_route_backward<T>(exec, s.probs, s.choice, s.gate, dgate, s.fraction, aux_scale, dlogits);
    gemm<T>(exec, true, false, T(1), x, dlogits, T(1), router_->grad_mat(exec));
    router_->reduce(exec);
    if (leader_)
      gemm<T>(exec, false, true, T(1), dlogits, router_->param().mat(), T(0), dx);
    else
      Kokkos::deep_copy(exec, dx, T(0));
  }

  Mat<T> dgate() const { return ws_.scratch(kGateGrad, rows_, shape_.top_k); }

private:
  Workspace<T>& ws_;
  MoeShape shape_;
  std::int64_t rows_, capacity_ = -1;
  const comm::Group* etp_; // expert tensor parallelism: the ranks routing the same tokens
  bool leader_;            // counts the aux loss and the router's input gradient
  std::vector<const comm::Group*> shares_groups_; // over which s.fraction is summed
  int shares_ = 1;                                // the shares summed in s.fraction
  std::optional<Shared<T>> router_;
  kernels::Tokens keys_;
  Kokkos::View<double*, MemSpace> means_;
  kernels::TokenIndexer sorter_;
};

template <class T>
class LocalMoE final : public MoE<T> {
public:
  LocalMoE(Params<T>& params, Workspace<T>& ws, const MoeNames& names, const MoeShape& shape,
           std::int64_t hidden, std::int64_t rows, double std_dev, double proj_std,
           std::uint64_t seed, const comm::Group* context, const comm::Group* etp)
      : ws_(ws),
        router_(params, ws, names, shape, hidden, rows, std_dev, seed, nullptr, context, etp),
        experts_(params, ws, names, 0, shape.experts, hidden, 4 * hidden, std_dev, proj_std, seed,
                 etp),
        shape_(shape), hidden_(hidden), ffn_(experts_.ffn()), rows_(rows) {
    expert_rows_ = moe_rows(shape.capacity_factor, rows, shape.top_k, shape.experts);
    ws.reserve(kExpertIn, expert_rows_ * hidden);
    ws.reserve(kExpertGrad, expert_rows_ * hidden);
    ws.reserve(kHiddenGrad, expert_rows_ * ffn_);
  }

  kernels::MoeSaved<T> make_saved() const override {
    return kernels::MoeSaved<T>::make(rows_, shape_.experts, shape_.top_k, expert_rows_, hidden_,
                                      ffn_);
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    const std::int64_t used = router_.route(exec, x, s);
    const Mat<T> xin = ws_.scratch(kExpertIn, expert_rows_, hidden_);
    kernels::moe_gather<T>(exec, x, s.pairs, used, xin);
    experts_.forward(exec, segments(s), xin, s.h, s.g, s.th, s.out, used);
    kernels::moe_combine<T>(exec, s.out, s.slot, s.gate, y);
    router_.aux_loss(exec, s, aux);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, T grad_scale) override {
    const std::int64_t used = s.host_offsets(shape_.experts);
    const Mat<T> xin = ws_.scratch(kExpertIn, expert_rows_, hidden_);
    const Mat<T> dout = ws_.scratch(kExpertGrad, expert_rows_, hidden_);
    const Mat<T> dhid = ws_.scratch(kHiddenGrad, expert_rows_, ffn_);
    const Mat<T> dgate = router_.dgate();
    kernels::moe_combine_backward<T>(exec, dy, s.out, s.slot, s.gate, s.pairs, used, dout, dgate);
    kernels::moe_gather<T>(exec, x, s.pairs, used, xin); // re-gathered, not kept
    experts_.backward(exec, segments(s), xin, s.h, s.g, s.th, dout, dhid, used);
    router_.backward(exec, x, s, dgate, dx, grad_scale);
    kernels::moe_scatter_add<T>(exec, dout, s.slot, dx);
  }

private:
  // Expert e's rows: [offsets(e), offsets(e + 1)).
  const std::vector<ExpertRows>& segments(const kernels::MoeSaved<T>& s) {
    segments_.clear();
    for (int e = 0; e < shape_.experts; ++e)
      if (s.host_offsets(e + 1) > s.host_offsets(e))
        segments_.push_back({e, s.host_offsets(e), s.host_offsets(e + 1) - s.host_offsets(e)});
    return segments_;
  }

  Workspace<T>& ws_;
  Router<T> router_;
  ExpertBank<T> experts_;
  MoeShape shape_;
  std::int64_t hidden_, ffn_, rows_, expert_rows_ = 0;
  std::vector<ExpertRows> segments_;
};

// Rank e of the ep group (P ranks) holds experts [e E/P, (e + 1) E/P). A rank's pairs,
// sorted by expert, are therefore sorted by destination: the block for rank j is the
// rows of experts j E/P .. (j + 1) E/P - 1. The rows received are ordered by source rank,
// then by expert; the experts run on each (source, expert) block.
template <class T>
class ExpertParallelMoE final : public MoE<T> {
public:
  ExpertParallelMoE(Params<T>& params, Workspace<T>& ws, const MoeNames& names,
                    const MoeShape& shape, std::int64_t hidden, std::int64_t rows, double std_dev,
                    double proj_std, std::uint64_t seed, const comm::Group& ep,
                    const comm::Group* tensor, const comm::Group* context,
                    const comm::Group* etp = nullptr)
      : ws_(ws), ep_(ep),
        router_(params, ws, names, shape, hidden, rows, std_dev, seed, tensor, context, etp),
        experts_(params, ws, names, ep.rank() * (shape.experts / ep.size()),
                 shape.experts / ep.size(), hidden, 4 * hidden, std_dev, proj_std, seed, etp),
        shape_(shape), hidden_(hidden), ffn_(experts_.ffn()), rows_(rows),
        here_(shape.experts / ep.size()) {
    CUBELM_ASSERT(shape.experts % ep.size() == 0,
                  "model.experts must be a multiple of parallel.expert_size");
    expert_rows_ = moe_rows(shape.capacity_factor, rows, shape.top_k, shape.experts);
    received_ =
        moe_received_rows(shape.capacity_factor, rows, shape.top_k, shape.experts, ep.size());
    ws.reserve(kExpertIn, expert_rows_ * hidden);
    ws.reserve(kExpertGrad, expert_rows_ * hidden);
    ws.reserve(kHiddenGrad, received_ * ffn_);
    ws.reserve(kReceived, received_ * hidden);
    send_counts_ = Kokkos::View<int*, Kokkos::HostSpace>("cubelm::moe_send_counts", shape.experts);
    const auto p = static_cast<std::size_t>(ep.size());
    to_.resize(p);
    from_.resize(p);
  }

  kernels::MoeSaved<T> make_saved() const override {
    return kernels::MoeSaved<T>::make(rows_, shape_.experts, shape_.top_k, expert_rows_, hidden_,
                                      ffn_, ep_.size(), received_);
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    const std::int64_t used = router_.route(exec, x, s);
    // Every rank learns how many rows it receives from each rank for each of its experts.
    for (int e = 0; e < shape_.experts; ++e)
      send_counts_(e) = s.host_offsets(e + 1) - s.host_offsets(e);
    ep_.all_to_all(HostExecSpace(), send_counts_, s.host_received);
    const std::int64_t got = counts(s);
    CUBELM_ASSERT(got <= received_, "expert rows received beyond the buffers' worst case");
    const Mat<T> xin = ws_.scratch(kExpertIn, expert_rows_, hidden_);
    kernels::moe_gather<T>(exec, x, s.pairs, used, xin);
    ep_.all_to_all_v(exec, xin, to_, s.xr, from_);
    const Mat<T> out = ws_.scratch(kReceived, received_, hidden_);
    experts_.forward(exec, segments_, s.xr, s.h, s.g, s.th, out, got);
    ep_.all_to_all_v(exec, out, from_, s.out, to_);
    kernels::moe_combine<T>(exec, s.out, s.slot, s.gate, y);
    router_.aux_loss(exec, s, aux);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, T grad_scale) override {
    const std::int64_t used = s.host_offsets(shape_.experts);
    const std::int64_t got = counts(s);
    const Mat<T> dout = ws_.scratch(kExpertGrad, expert_rows_, hidden_);
    const Mat<T> dreceived = ws_.scratch(kReceived, received_, hidden_);
    const Mat<T> dhid = ws_.scratch(kHiddenGrad, received_, ffn_);
    const Mat<T> dgate = router_.dgate();
    kernels::moe_combine_backward<T>(exec, dy, s.out, s.slot, s.gate, s.pairs, used, dout, dgate);
    ep_.all_to_all_v(exec, dout, to_, dreceived, from_);
    experts_.backward(exec, segments_, s.xr, s.h, s.g, s.th, dreceived, dhid, got);
    ep_.all_to_all_v(exec, dreceived, from_, dout, to_);
    router_.backward(exec, x, s, dgate, dx, grad_scale);
    kernels::moe_scatter_add<T>(exec, dout, s.slot, dx);
  }

private:
  // From the saved routing: the elements for and from each rank (to_, from_) and the
  // (source, expert) blocks of the rows received (segments_). Returns the rows received.
  std::int64_t counts(const kernels::MoeSaved<T>& s) {
    const int p = ep_.size();
    segments_.clear();
    std::int64_t first = 0;
    for (int j = 0; j < p; ++j) {
      const auto k = static_cast<std::size_t>(j);
      to_[k] =
          static_cast<std::size_t>(s.host_offsets((j + 1) * here_) - s.host_offsets(j * here_)) *
          static_cast<std::size_t>(hidden_);
      std::int64_t rows = 0;
      for (int e = 0; e < here_; ++e) {
        const std::int64_t n = s.host_received(j * here_ + e);
        if (n > 0)
          segments_.push_back({e, first + rows, n});
        rows += n;
      }
      from_[k] = static_cast<std::size_t>(rows * hidden_);
      first += rows;
    }
    return first;
  }

  Workspace<T>& ws_;
  const comm::Group& ep_;
  Router<T> router_;
  ExpertBank<T> experts_;
  MoeShape shape_;
  std::int64_t hidden_, ffn_, rows_, expert_rows_ = 0, received_ = 0;
  int here_; // experts on this rank
  Kokkos::View<int*, Kokkos::HostSpace> send_counts_;
  std::vector<std::size_t> to_, from_;
  std::vector<ExpertRows> segments_;
};

// An MoE feed-forward that hands its rows, rearranged, to another (`inner_`), which keeps
// the micro-batch's buffers.
template <class T>
class WrappedMoE : public MoE<T> {
public:
  kernels::MoeSaved<T> make_saved() const override { return inner_->make_saved(); }

protected:
  explicit WrappedMoE(std::unique_ptr<MoE<T>> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<MoE<T>> inner_;
};

// Expert tensor parallelism: every expert's hidden layer split over the tensor ranks
// (w1's columns, b1 and w2's rows; b2 whole, added by rank 0). Each rank holds an equal
// share of the group's tokens; the shares are all-gathered, every rank routes all of them
// alike through its slices of the experts (`inner`), and the partial outputs are
// reduce-scattered back into the shares. Backward gathers the input again and the
// output's gradient, and reduce-scatters the input's partial gradient.
template <class T>
class ExpertTensorMoE final : public WrappedMoE<T> {
  using WrappedMoE<T>::inner_;

public:
  ExpertTensorMoE(std::unique_ptr<MoE<T>> inner, const comm::Group& tensor, std::int64_t share,
                  std::int64_t hidden, Workspace<T>& ws)
      : WrappedMoE<T>(std::move(inner)), tensor_(tensor), ws_(ws), all_(share * tensor.size()),
        hidden_(hidden) {
    for (const std::size_t k : {kGroupIn, kGroupOut, kGroupGrad})
      ws.reserve(k, all_ * hidden);
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    const Mat<T> xa = ws_.scratch(kGroupIn, all_, hidden_);
    const Mat<T> ya = ws_.scratch(kGroupOut, all_, hidden_);
    tensor_.all_gather(exec, x, xa);
    inner_->forward(exec, xa, ya, s, aux);
    tensor_.reduce_scatter(exec, ya, y);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, T grad_scale) override {
    const Mat<T> xa = ws_.scratch(kGroupIn, all_, hidden_);
    const Mat<T> dya = ws_.scratch(kGroupOut, all_, hidden_);
    const Mat<T> dxa = ws_.scratch(kGroupGrad, all_, hidden_);
    tensor_.all_gather(exec, x, xa);
    tensor_.all_gather(exec, dy, dya);
    inner_->backward(exec, xa, dya, dxa, s, grad_scale);
    tensor_.reduce_scatter(exec, dxa, dx);
  }

private:
  const comm::Group& tensor_;
  Workspace<T>& ws_;
  std::int64_t all_, hidden_;
};

// Expert tensor parallelism under 1d without sequence parallelism: the tokens are
// replicated over the tensor ranks already, so every rank routes all of them through its
// slices of the experts (`inner`) and the partial outputs, and backward the input's
// partial gradients, are all-reduced (Megatron's layout).
template <class T>
class ReplicatedExpertTensorMoE final : public WrappedMoE<T> {
  using WrappedMoE<T>::inner_;

public:
  ReplicatedExpertTensorMoE(std::unique_ptr<MoE<T>> inner, const comm::Group& tensor)
      : WrappedMoE<T>(std::move(inner)), tensor_(tensor) {}

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    inner_->forward(exec, x, y, s, aux);
    tensor_.all_reduce(exec, y);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, T grad_scale) override {
    inner_->backward(exec, x, dy, dx, s, grad_scale);
    tensor_.all_reduce(exec, dx);
  }

private:
  const comm::Group& tensor_;
};

// Under 1d tensor parallelism every rank of the group holds the same tokens (the
// LayerNorm's output, N rows); rank t routes its share, rows [t N/p, (t + 1) N/p), through
// an expert-parallel MoE whose ep group spans the tensor ranks. The output of the shares
// is all-gathered into the replicated N rows, or with sequence parallelism is this rank's
// block of the residual stream already; backward takes the share's rows of the output's
// gradient and hands back the input's gradient all-gathered (replicated, as a
// column-parallel linear's), or with sequence parallelism as this rank's partial sum (its
// share's rows, zero elsewhere), which the LayerNorm reduce-scatters.
template <class T>
class TokenShareMoE final : public WrappedMoE<T> {
  using WrappedMoE<T>::inner_;

public:
  TokenShareMoE(std::unique_ptr<MoE<T>> inner, const comm::Group& tensor, bool split,
                std::int64_t rows, std::int64_t hidden, Workspace<T>& ws)
      : WrappedMoE<T>(std::move(inner)), tensor_(tensor), split_(split), ws_(ws),
        share_(rows / tensor.size()), first_(tensor.rank() * share_), hidden_(hidden) {
    if (!split_)
      ws.reserve(kShareOut, share_ * hidden);
    ws.reserve(kShareGrad, share_ * hidden);
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    if (split_) {
      inner_->forward(exec, mine(x), y, s, aux);
      return;
    }
    const Mat<T> part = ws_.scratch(kShareOut, share_, hidden_);
    inner_->forward(exec, mine(x), part, s, aux);
    tensor_.all_gather(exec, part, y);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, T grad_scale) override {
    const Mat<T> part = ws_.scratch(kShareGrad, share_, hidden_);
    inner_->backward(exec, mine(x), split_ ? dy : mine(dy), part, s, grad_scale);
    if (!split_) {
      tensor_.all_gather(exec, part, dx);
      return;
    }
    Kokkos::deep_copy(exec, dx, T(0));
    Kokkos::deep_copy(exec, mine(dx), part);
  }

private:
  Mat<T> mine(const Mat<T>& m) const {
    return Kokkos::subview(m, std::make_pair(first_, first_ + share_), Kokkos::ALL);
  }

  const comm::Group& tensor_;
  bool split_;
  Workspace<T>& ws_;
  std::int64_t share_, first_, hidden_;
};

// Under 2d and 3d tensor parallelism the LayerNorm's output (R rows) and the residual
// stream hold a block of the features, H / c of them, the same R rows on the c ranks of
// the `features` group (2d: the row group, 3d: the C axis) and other rows elsewhere. An
// all_to_all over that group turns this rank's [R, H / c] into whole rows of its share,
// rows [f R / c, (f + 1) R / c) with f its rank there: every rank of the tensor group
// then routes its own N / p tokens through an expert-parallel MoE whose ep group spans
// the tensor ranks. The share's output goes back the reverse way, into the rank's
// [R, H / c] block of the residual stream. Backward exchanges the input again (it is not
// kept), the output's gradient, and the input's gradient back: the exchanges are
// permutations, so every gradient is complete in the rank's layout.
template <class T>
class FeatureShareMoE final : public WrappedMoE<T> {
  using WrappedMoE<T>::inner_;

public:
  FeatureShareMoE(std::unique_ptr<MoE<T>> inner, const comm::Group& features, std::int64_t rows,
                  std::int64_t hidden, Workspace<T>& ws)
      : WrappedMoE<T>(std::move(inner)), features_(features), ws_(ws), rows_(rows),
        share_(rows / features.size()), hidden_(hidden), block_(hidden / features.size()) {
    for (const std::size_t k : {kShareIn, kShareOut, kShareGrad})
      ws.reserve(k, share_ * hidden);
    ws.reserve(kExchange, rows * block_);
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    const Mat<T> xs = ws_.scratch(kShareIn, share_, hidden_);
    const Mat<T> ys = ws_.scratch(kShareOut, share_, hidden_);
    to_share(exec, x, xs);
    inner_->forward(exec, xs, ys, s, aux);
    from_share(exec, ys, y);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, T grad_scale) override {
    const Mat<T> xs = ws_.scratch(kShareIn, share_, hidden_);
    const Mat<T> dys = ws_.scratch(kShareOut, share_, hidden_);
    const Mat<T> dxs = ws_.scratch(kShareGrad, share_, hidden_);
    to_share(exec, x, xs);
    to_share(exec, dy, dys);
    inner_->backward(exec, xs, dys, dxs, s, grad_scale);
    from_share(exec, dxs, dx);
  }

private:
  // Rows [f R / c, (f + 1) R / c) of `m` (R rows), or feature block f of `m` (H columns).
  Mat<T> rows_of(const Mat<T>& m, int f) const {
    return Kokkos::subview(m, std::make_pair(f * share_, (f + 1) * share_), Kokkos::ALL);
  }
  auto features_of(const Mat<T>& m, int f) const {
    return Kokkos::subview(m, Kokkos::ALL, std::make_pair(f * block_, (f + 1) * block_));
  }

  // [R, H / c] here -> this rank's share, whole rows [R / c, H]: rank f' sends rows block
  // f (contiguous) of its features block f'.
  void to_share(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& share) {
    const Mat<T> got = ws_.scratch(kExchange, rows_, block_);
    features_.all_to_all(exec, x, got);
    for (int f = 0; f < features_.size(); ++f)
      Kokkos::deep_copy(exec, features_of(share, f), rows_of(got, f));
  }

  // The reverse: rank f gets back its features block of this share's rows.
  void from_share(const ExecSpace& exec, const Mat<T>& share, const Mat<T>& x) {
    const Mat<T> out = ws_.scratch(kExchange, rows_, block_);
    for (int f = 0; f < features_.size(); ++f)
      Kokkos::deep_copy(exec, rows_of(out, f), features_of(share, f));
    features_.all_to_all(exec, out, x);
  }

  const comm::Group& features_;
  Workspace<T>& ws_;
  std::int64_t rows_, share_, hidden_, block_;
};

} // namespace

template <class T>
std::unique_ptr<MoE<T>>
make_moe(Params<T>& params, Workspace<T>& ws, const MoeNames& names, const MoeShape& shape,
         std::int64_t hidden, std::int64_t rows, double std_dev, double proj_std,
         std::uint64_t seed, const comm::Group* ep, const comm::Group* context,
         const comm::Group* tensor, bool split, const comm::Group* features, bool expert_tensor) {
  const bool spread = ep != nullptr && ep->size() > 1;
  if (tensor != nullptr && tensor->size() > 1) {
    // The ranks holding the same rows: the whole group in 1d, the feature group in 2d/3d.
    const int c = features != nullptr ? features->size() : tensor->size();
    CUBELM_ASSERT(rows % c == 0 && hidden % c == 0,
                  "MoE layers under tensor parallelism need the tokens to split evenly");
    const std::int64_t share = rows / c;
    std::unique_ptr<MoE<T>> inner;
    if (expert_tensor) {
      CUBELM_ASSERT(4 * hidden % tensor->size() == 0,
                    "expert tensor parallelism splits 4 x model.hidden over tensor_size");
      const std::int64_t all = share * tensor->size();
      std::unique_ptr<MoE<T>> routed;
      if (spread)
        routed =
            std::make_unique<ExpertParallelMoE<T>>(params, ws, names, shape, hidden, all, std_dev,
                                                   proj_std, seed, *ep, nullptr, context, tensor);
      else
        routed = std::make_unique<LocalMoE<T>>(params, ws, names, shape, hidden, all, std_dev,
                                               proj_std, seed, context, tensor);
      // 1d without sequence parallelism: the rows are the group's tokens already.
      if (features == nullptr && !split)
        return std::make_unique<ReplicatedExpertTensorMoE<T>>(std::move(routed), *tensor);
      inner = std::make_unique<ExpertTensorMoE<T>>(std::move(routed), *tensor, share, hidden, ws);
    } else {
      CUBELM_ASSERT(spread && ep->size() % tensor->size() == 0,
                    "MoE layers under tensor parallelism spread their experts over the tensor "
                    "ranks: parallel.expert_size must be a multiple of tensor_size");
      inner = std::make_unique<ExpertParallelMoE<T>>(params, ws, names, shape, hidden, share,
                                                     std_dev, proj_std, seed, *ep, tensor, context);
    }
    if (features != nullptr)
      return std::make_unique<FeatureShareMoE<T>>(std::move(inner), *features, rows, hidden, ws);
    return std::make_unique<TokenShareMoE<T>>(std::move(inner), *tensor, split, rows, hidden, ws);
  }
  if (spread)
    return std::make_unique<ExpertParallelMoE<T>>(params, ws, names, shape, hidden, rows, std_dev,
                                                  proj_std, seed, *ep, nullptr, context);
  return std::make_unique<LocalMoE<T>>(params, ws, names, shape, hidden, rows, std_dev, proj_std,
                                       seed, context, nullptr);
}

template std::unique_ptr<MoE<float>>
make_moe<float>(Params<float>&, Workspace<float>&, const MoeNames&, const MoeShape&, std::int64_t,
                std::int64_t, double, double, std::uint64_t, const comm::Group*, const comm::Group*,
                const comm::Group*, bool, const comm::Group*, bool);
template std::unique_ptr<MoE<double>>
make_moe<double>(Params<double>&, Workspace<double>&, const MoeNames&, const MoeShape&,
                 std::int64_t, std::int64_t, double, double, std::uint64_t, const comm::Group*,
                 const comm::Group*, const comm::Group*, bool, const comm::Group*, bool);

} // namespace cubelm::tp::detail
