#pragma once
// The router of an MoE feed-forward and its routing (kernels::moe_route, moe_dispatch):
// shared by LocalMoE and ExpertParallelMoE (moe_dispatch.hpp). Internal to src/tp.

#include "cubelm/kernels/moe.hpp"
#include "parts.hpp"

#include <optional>
#include <vector>

namespace cubelm::tp::detail {

// The router's buffers (buffer_names.hpp; described in tp/buffers.hpp).
using moe::kGateGrad;
using moe::kKeys;
using moe::kLogitGrad;
using moe::kProbMeans;
using moe::kRouterPartial;

// The router and the routing: what both MoE feed-forwards (moe_dispatch.hpp) share. When the
// micro-batch's tokens are shared out (`tensor`: the tensor-parallel ranks, each routing an equal
// share of the same tokens; `context`: the ranks sharing the sequences) the load fractions f_e are
// those of the whole micro-batch: s.fraction holds the sum of the shares (an all_reduce of E values
// per group, layer and micro-batch) and the loss's scales divide by the number of shares. Each rank
// adds N f_e P_e with its own P_e: summed over the shares that is the single process's N_all aux.
// Under tensor parallelism the router is replicated over `tensor` and its gradient, each rank's
// share's, summed over it. With expert tensor parallelism (`etp`: the tensor ranks, each holding a
// slice of every expert's hidden layer) every rank of `etp` routes the same tokens alike: the
// gates' gradient, partial sums of the slices, is all-reduced over it, the router's gradient is
// then the same everywhere (replicated, not summed), and the aux loss and the input's
// gradient through the router are counted on rank 0 of `etp` only.
template <class T>
class Router {
public:
  using G = compute_t<T>; // the routing's type (probabilities, gates and their gradients)
  Router(Params<T>& params, Workspace<T>& ws, const MoeNames& names, const MoeShape& shape,
         const MoeSizes& sizes, const comm::Group* tensor, const comm::Group* context,
         const comm::Group* etp)
      : ws_(ws), shape_(shape), rows_(sizes.rows),
        etp_(etp != nullptr && etp->size() > 1 ? etp : nullptr),
        leader_(etp_ == nullptr || etp_->rank() == 0) {
    for (const comm::Group* g : {tensor, context})
      if (g != nullptr && g->size() > 1) {
        shares_groups_.push_back(g);
        shares_ *= g->size();
      }
    const std::int64_t e = shape.experts, h = sizes.hidden, rows = sizes.rows;
    CUBELM_ASSERT(static_cast<std::int64_t>(names.w1.size()) == e &&
                      names.b1.size() == names.w1.size() && names.w2.size() == names.w1.size() &&
                      names.b2.size() == names.w1.size(),
                  "an MoE layer needs four tensor names per expert");
    CUBELM_ASSERT(shape.top_k >= 1 && shape.top_k <= shape.experts,
                  "model.top_k must lie in [1, model.experts]");
    Param<T> router =
        make_param<T>(names.router, {h, e}, {0, 0}, {h, e}, sizes.std_dev, 0, sizes.seed);
    if (tensor != nullptr && tensor->size() > 1)
      router_.emplace(
          Shared<T>::replicated(params, std::move(router), *tensor, tensor, ws, kRouterPartial));
    else if (etp_ != nullptr)
      router_.emplace(
          Shared<T>::replicated(params, std::move(router), *etp_, nullptr, ws, kRouterPartial));
    else
      router_.emplace(Shared<T>::owned(params, std::move(router)));
    capacity_ = moe_capacity(shape.capacity_factor, rows, shape.top_k, shape.experts);
    keys_ = ws.tokens(kKeys, rows * shape.top_k);
    means_ = ws.doubles(kProbMeans, e);
    ws.reserve(kLogitGrad, rows * e, Holds::compute);
    ws.reserve(kGateGrad, rows * shape.top_k, Holds::compute);
  }

  // Routes x: probabilities, choices, gates, slots, the pairs sorted by expert and their
  // offsets, also on the host. Returns the rows used (pairs kept).
  std::int64_t route(const ExecSpace& exec, const Mat<T>& x, kernels::MoeSaved<T>& s) {
    using namespace kernels;
    gemm<T>(exec, false, false, T(1), x, router_->param().mat(), T(0), s.probs);
    moe_route<G>(exec, s.probs, s.choice, s.gate);
    moe_dispatch<G>(exec, s.choice, capacity_, keys_, sorter_, s.slot, s.pairs, s.offsets,
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
      kernels::moe_aux_loss<G>(
          exec, s.probs, s.fraction,
          shape_.aux_loss * shape_.experts * static_cast<double>(rows_) / shares_, means_, aux);
  }

  // The router's part of backward: from the gates' gradient (and the load-balancing
  // loss), the router's gradient and dx = dlogits Wr^T (assigned).
  void backward(const ExecSpace& exec, const Mat<T>& x, const kernels::MoeSaved<T>& s,
                const Mat<G>& dgate, const Mat<T>& dx, G grad_scale) {
    using namespace kernels;
    const Mat<G> dlogits = ws_.compute_scratch(kLogitGrad, rows_, shape_.experts);
    if (etp_ != nullptr)
      etp_->all_reduce(exec, dgate);
    // d(N aux)/d p[t,e] = aux_loss E f_e (docs/model.md), scaled like the loss sum.
    const G aux_scale = static_cast<G>(shape_.aux_loss * shape_.experts / shares_) * grad_scale;
    moe_route_backward<G>(exec, s.probs, s.choice, s.gate, dgate, s.fraction, aux_scale, dlogits);
    gemm<T>(exec, true, false, T(1), x, dlogits, T(1), router_->grad_mat(exec));
    router_->reduce(exec);
    if (leader_)
      gemm(exec, false, true, G(1), dlogits, router_->param().mat(), G(0), dx);
    else
      Kokkos::deep_copy(exec, dx, T(G(0)));
  }

  Mat<G> dgate() const { return ws_.compute_scratch(kGateGrad, rows_, shape_.top_k); }

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

} // namespace cubelm::tp::detail
