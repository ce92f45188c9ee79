#pragma once
// The two MoE feed-forwards that route tokens to experts (moe.cpp says how the layout
// wrappers of moe_shares.hpp build on them). Internal to src/tp.
//  - LocalMoE: the router and every expert on this rank; tokens never leave it.
//  - ExpertParallelMoE: the router here, experts / ep experts on each rank of the "ep"
//    group; the rows of the (token, expert) pairs travel to the rank of their expert and
//    back with all_to_all_v.

#include "moe_experts.hpp"
#include "moe_router.hpp"

#include <vector>

namespace cubelm::tp::detail {

// Scratch buffers (buffer_names.hpp; described in tp/buffers.hpp).
using moe::kExpertGrad;
using moe::kExpertIn;
using moe::kHiddenGrad;
using moe::kReceived;

template <class T>
class LocalMoE final : public MoE<T> {
public:
  LocalMoE(Params<T>& params, Workspace<T>& ws, const MoeNames& names, const MoeShape& shape,
           const MoeSizes& sizes, const comm::Group* context, const comm::Group* etp)
      : ws_(ws), router_(params, ws, names, shape, sizes, nullptr, context, etp),
        experts_(params, ws, names, 0, shape.experts, sizes, etp), shape_(shape),
        hidden_(sizes.hidden), ffn_(experts_.ffn()), rows_(sizes.rows) {
    expert_rows_ = moe_rows(shape.capacity_factor, rows_, shape.top_k, shape.experts);
    ws.reserve(kExpertIn, expert_rows_ * hidden_);
    ws.reserve(kExpertGrad, expert_rows_ * hidden_);
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
                kernels::MoeSaved<T>& s, compute_t<T> grad_scale) override {
    const std::int64_t used = s.host_offsets(shape_.experts);
    const Mat<T> xin = ws_.scratch(kExpertIn, expert_rows_, hidden_);
    const Mat<T> dout = ws_.scratch(kExpertGrad, expert_rows_, hidden_);
    const Mat<T> dhid = ws_.scratch(kHiddenGrad, expert_rows_, ffn_);
    const auto dgate = router_.dgate();
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
                    const MoeShape& shape, const MoeSizes& sizes, const comm::Group& ep,
                    const comm::Group* tensor, const comm::Group* context, const comm::Group* etp)
      : ws_(ws), ep_(ep), router_(params, ws, names, shape, sizes, tensor, context, etp),
        experts_(params, ws, names, ep.rank() * (shape.experts / ep.size()),
                 shape.experts / ep.size(), sizes, etp),
        shape_(shape), hidden_(sizes.hidden), ffn_(experts_.ffn()), rows_(sizes.rows),
        here_(shape.experts / ep.size()) {
    CUBELM_ASSERT(shape.experts % ep.size() == 0,
                  "model.experts must be a multiple of parallel.expert_size");
    expert_rows_ = moe_rows(shape.capacity_factor, rows_, shape.top_k, shape.experts);
    received_ =
        moe_received_rows(shape.capacity_factor, rows_, shape.top_k, shape.experts, ep.size());
    ws.reserve(kExpertIn, expert_rows_ * hidden_);
    ws.reserve(kExpertGrad, expert_rows_ * hidden_);
    ws.reserve(kHiddenGrad, received_ * ffn_);
    ws.reserve(kReceived, received_ * hidden_);
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
                kernels::MoeSaved<T>& s, compute_t<T> grad_scale) override {
    const std::int64_t used = s.host_offsets(shape_.experts);
    const std::int64_t got = counts(s);
    const Mat<T> dout = ws_.scratch(kExpertGrad, expert_rows_, hidden_);
    const Mat<T> dreceived = ws_.scratch(kReceived, received_, hidden_);
    const Mat<T> dhid = ws_.scratch(kHiddenGrad, received_, ffn_);
    const auto dgate = router_.dgate();
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

} // namespace cubelm::tp::detail
