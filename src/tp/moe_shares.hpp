#pragma once
// The MoE feed-forwards of the tensor-parallel layouts: each hands its rows, rearranged,
// to an inner LocalMoE or ExpertParallelMoE (moe_dispatch.hpp). Internal to src/tp.
//  - TokenShareMoE (1d): each tensor rank routes its share of the replicated tokens.
//  - FeatureShareMoE (2d, 3d): the same, each rank's share made whole rows by an
//    all_to_all over the ranks that hold the other features of its rows.
//  - ExpertTensorMoE (expert tensor parallelism): inside either, the shares gathered and
//    routed alike by every tensor rank through its slices of the experts;
//    ReplicatedExpertTensorMoE: under 1d without sequence parallelism, the replicated rows
//    routed directly and the partial outputs all-reduced.

#include "parts.hpp"

#include <memory>

namespace cubelm::tp::detail {

// Scratch buffers of the wrappers (buffer_names.hpp; described in tp/buffers.hpp).
using moe::kExchange;
using moe::kGroupGrad;
using moe::kGroupIn;
using moe::kGroupOut;
using moe::kShareGrad;
using moe::kShareIn;
using moe::kShareOut;

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
    for (const ScratchName k : {kGroupIn, kGroupOut, kGroupGrad})
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
                kernels::MoeSaved<T>& s, compute_t<T> grad_scale) override {
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
                kernels::MoeSaved<T>& s, compute_t<T> grad_scale) override {
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
  TokenShareMoE(std::unique_ptr<MoE<T>> inner, const comm::Group& tensor, bool sequence_parallel,
                std::int64_t rows, std::int64_t hidden, Workspace<T>& ws)
      : WrappedMoE<T>(std::move(inner)), tensor_(tensor), sequence_parallel_(sequence_parallel),
        ws_(ws), share_(rows / tensor.size()), first_(tensor.rank() * share_), hidden_(hidden) {
    if (!sequence_parallel_)
      ws.reserve(kShareOut, share_ * hidden);
    ws.reserve(kShareGrad, share_ * hidden);
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    if (sequence_parallel_) {
      inner_->forward(exec, mine(x), y, s, aux);
      return;
    }
    const Mat<T> part = ws_.scratch(kShareOut, share_, hidden_);
    inner_->forward(exec, mine(x), part, s, aux);
    tensor_.all_gather(exec, part, y);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, compute_t<T> grad_scale) override {
    const Mat<T> part = ws_.scratch(kShareGrad, share_, hidden_);
    inner_->backward(exec, mine(x), sequence_parallel_ ? dy : mine(dy), part, s, grad_scale);
    if (!sequence_parallel_) {
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
  bool sequence_parallel_; // the output is this rank's rows only
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
    for (const ScratchName k : {kShareIn, kShareOut, kShareGrad})
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
                kernels::MoeSaved<T>& s, compute_t<T> grad_scale) override {
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

} // namespace cubelm::tp::detail
