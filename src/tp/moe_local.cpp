// The MoE feed-forward of a tensor-parallel group of one rank: the router and every
// expert live here, and tokens never leave the rank (docs/model.md for the semantics).
//
// Forward: logits = x Wr, softmax and top-k (kernels::moe_route), the pairs sorted by
// expert into contiguous rows (moe_dispatch), the rows of x gathered, each expert's
// MLP run on its rows with ordinary gemms, and the outputs combined with the gates.
// The expert matmuls need each expert's row count on the host: one small copy (E + 1
// ints) from the device per layer and micro-batch. Backward re-gathers the expert
// inputs instead of keeping them.

#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/moe.hpp"
#include "modes.hpp"
#include "parts.hpp"

#include <string>

namespace cubelm::tp::detail {

namespace {

// Scratch buffers shared by all MoE layers of the mode (1D uses 0 and 1 under sequence
// parallelism).
enum MoeScratch : std::size_t {
  kExpertIn = 2,   // [R, H]: the gathered expert inputs (backward)
  kExpertGrad = 3, // [R, H]: the expert outputs' gradient, then the inputs'
  kHiddenGrad = 4, // [R, F]: the hidden layer's gradient, before and after GELU
  kLogitGrad = 5,  // [N, E]: the router logits' gradient
  kGateGrad = 6    // [N, k]: the gates' gradient
};

template <class T>
class LocalMoE final : public MoE<T> {
public:
  LocalMoE(Params<T>& params, Workspace<T>& ws, const MoeNames& names, const MoeShape& shape,
           std::int64_t hidden, std::int64_t rows, double std_dev, double proj_std,
           std::uint64_t seed)
      : ws_(ws), shape_(shape), hidden_(hidden), ffn_(4 * hidden), rows_(rows) {
    const std::int64_t e = shape.experts, h = hidden, f = ffn_;
    CUBELM_ASSERT(static_cast<std::int64_t>(names.w1.size()) == e &&
                      names.b1.size() == names.w1.size() && names.w2.size() == names.w1.size() &&
                      names.b2.size() == names.w1.size(),
                  "an MoE layer needs four tensor names per expert");
    CUBELM_ASSERT(shape.top_k >= 1 && shape.top_k <= shape.experts,
                  "model.top_k must lie in [1, model.experts]");
    auto add = [&](const std::string& name, std::vector<std::int64_t> dims, double sd) {
      const std::vector<std::int64_t> zero(dims.size(), 0);
      return &Shared<T>::owned(params, make_param<T>(name, dims, zero, dims, sd, 0, seed)).param();
    };
    router_ = add(names.router, {h, e}, std_dev);
    for (std::int64_t i = 0; i < e; ++i) {
      const auto k = static_cast<std::size_t>(i);
      w1_.push_back(add(names.w1[k], {h, f}, std_dev));
      b1_.push_back(add(names.b1[k], {f}, 0));
      w2_.push_back(add(names.w2[k], {f, h}, proj_std));
      b2_.push_back(add(names.b2[k], {h}, 0));
    }
    capacity_ = moe_capacity(shape.capacity_factor, rows, shape.top_k, shape.experts);
    expert_rows_ = moe_rows(shape.capacity_factor, rows, shape.top_k, shape.experts);
    keys_ = ws.tokens("cubelm::moe_keys", rows * shape.top_k);
    means_ = ws.doubles("cubelm::moe_prob_means", e);
    ws.reserve(kExpertIn, expert_rows_ * h);
    ws.reserve(kExpertGrad, expert_rows_ * h);
    ws.reserve(kHiddenGrad, expert_rows_ * f);
    ws.reserve(kLogitGrad, rows * e);
    ws.reserve(kGateGrad, rows * shape.top_k);
  }

  kernels::MoeSaved<T> make_saved() const override {
    return kernels::MoeSaved<T>::make(rows_, shape_.experts, shape_.top_k, expert_rows_, hidden_,
                                      ffn_);
  }

  void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y, kernels::MoeSaved<T>& s,
               const Kokkos::View<double*, MemSpace>& aux) override {
    using namespace kernels;
    gemm<T>(exec, false, false, T(1), x, router_->mat(), T(0), s.probs);
    moe_route<T>(exec, s.probs, s.choice, s.gate);
    moe_dispatch<T>(exec, s.choice, capacity_, keys_, sorter_, s.slot, s.pairs, s.offsets,
                    s.fraction);
    Kokkos::deep_copy(exec, s.host_offsets, s.offsets);
    exec.fence(); // the expert matmuls' sizes
    const std::int64_t used = s.host_offsets(shape_.experts);
    const Mat<T> xin = ws_.scratch(kExpertIn, expert_rows_, hidden_);
    moe_gather<T>(exec, x, s.pairs, used, xin);
    for (int e = 0; e < shape_.experts; ++e)
      if (count(s, e)) {
        const Mat<T> h = rows_of(s.h, s, e);
        gemm<T>(exec, false, false, T(1), rows_of(xin, s, e), w1_[e]->mat(), T(0), h);
        bias_add<T>(exec, h, b1_[e]->value);
      }
    gelu_forward<T>(exec, head(s.h, used), head(s.g, used), head(s.th, used));
    for (int e = 0; e < shape_.experts; ++e)
      if (count(s, e)) {
        const Mat<T> out = rows_of(s.out, s, e);
        gemm<T>(exec, false, false, T(1), rows_of(s.g, s, e), w2_[e]->mat(), T(0), out);
        bias_add<T>(exec, out, b2_[e]->value);
      }
    moe_combine<T>(exec, s.out, s.slot, s.gate, y);
    if (aux.extent(0) > 0 && shape_.aux_loss > 0)
      moe_aux_loss<T>(exec, s.probs, s.fraction,
                      shape_.aux_loss * shape_.experts * static_cast<double>(rows_), means_, aux);
  }

  void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                kernels::MoeSaved<T>& s, T grad_scale) override {
    using namespace kernels;
    const std::int64_t used = s.host_offsets(shape_.experts);
    const Mat<T> xin = ws_.scratch(kExpertIn, expert_rows_, hidden_);
    const Mat<T> dout = ws_.scratch(kExpertGrad, expert_rows_, hidden_);
    const Mat<T> dhid = ws_.scratch(kHiddenGrad, expert_rows_, ffn_);
    const Mat<T> dlogits = ws_.scratch(kLogitGrad, rows_, shape_.experts);
    const Mat<T> dgate = ws_.scratch(kGateGrad, rows_, shape_.top_k);
    moe_combine_backward<T>(exec, dy, s.out, s.slot, s.gate, s.pairs, used, dout, dgate);
    for (int e = 0; e < shape_.experts; ++e)
      if (count(s, e)) {
        const Mat<T> d = rows_of(dout, s, e);
        gemm<T>(exec, true, false, T(1), rows_of(s.g, s, e), d, T(1), w2_[e]->grad_mat());
        bias_backward<T>(exec, d, b2_[e]->grad);
        gemm<T>(exec, false, true, T(1), d, w2_[e]->mat(), T(0), rows_of(dhid, s, e));
      }
    gelu_backward<T>(exec, head(s.h, used), head(s.th, used), head(dhid, used), head(dhid, used));
    moe_gather<T>(exec, x, s.pairs, used, xin);
    for (int e = 0; e < shape_.experts; ++e)
      if (count(s, e)) {
        const Mat<T> d = rows_of(dhid, s, e);
        gemm<T>(exec, true, false, T(1), rows_of(xin, s, e), d, T(1), w1_[e]->grad_mat());
        bias_backward<T>(exec, d, b1_[e]->grad);
        gemm<T>(exec, false, true, T(1), d, w1_[e]->mat(), T(0), rows_of(dout, s, e));
      }
    // d(N aux)/d p[t,e] = aux_loss E f_e (docs/model.md), scaled like the loss sum.
    const T aux_scale = static_cast<T>(shape_.aux_loss * shape_.experts) * grad_scale;
    moe_route_backward<T>(exec, s.probs, s.choice, s.gate, dgate, s.fraction, aux_scale, dlogits);
    gemm<T>(exec, true, false, T(1), x, dlogits, T(1), router_->grad_mat());
    gemm<T>(exec, false, true, T(1), dlogits, router_->mat(), T(0), dx);
    moe_scatter_add<T>(exec, dout, s.slot, dx);
  }

private:
  static std::int64_t count(const kernels::MoeSaved<T>& s, int e) {
    return s.host_offsets(e + 1) - s.host_offsets(e);
  }
  // The rows of expert e in a buffer of expert rows.
  static Mat<T> rows_of(const Mat<T>& m, const kernels::MoeSaved<T>& s, int e) {
    return Mat<T>(m.data() + static_cast<std::int64_t>(s.host_offsets(e)) * m.extent(1),
                  count(s, e), m.extent(1));
  }
  // The first `rows` rows of a buffer.
  static Mat<T> head(const Mat<T>& m, std::int64_t rows) {
    return Mat<T>(m.data(), rows, m.extent(1));
  }

  Workspace<T>& ws_;
  MoeShape shape_;
  std::int64_t hidden_, ffn_, rows_, capacity_ = -1, expert_rows_ = 0;
  Param<T>* router_ = nullptr;
  std::vector<Param<T>*> w1_, b1_, w2_, b2_;
  kernels::Tokens keys_;
  Kokkos::View<double*, MemSpace> means_;
  kernels::TokenIndexer sorter_;
};

} // namespace

template <class T>
std::unique_ptr<MoE<T>> make_local_moe(Params<T>& params, Workspace<T>& ws, const MoeNames& names,
                                       const MoeShape& shape, std::int64_t hidden,
                                       std::int64_t rows, double std_dev, double proj_std,
                                       std::uint64_t seed) {
  return std::make_unique<LocalMoE<T>>(params, ws, names, shape, hidden, rows, std_dev, proj_std,
                                       seed);
}

template std::unique_ptr<MoE<float>> make_local_moe<float>(Params<float>&, Workspace<float>&,
                                                           const MoeNames&, const MoeShape&,
                                                           std::int64_t, std::int64_t, double,
                                                           double, std::uint64_t);
template std::unique_ptr<MoE<double>> make_local_moe<double>(Params<double>&, Workspace<double>&,
                                                             const MoeNames&, const MoeShape&,
                                                             std::int64_t, std::int64_t, double,
                                                             double, std::uint64_t);

} // namespace cubelm::tp::detail
