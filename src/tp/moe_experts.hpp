#pragma once
// The experts of an MoE feed-forward that one rank holds, and their matrix products on
// rows grouped by expert: shared by the MoE of one rank (moe.cpp's LocalMoE), which holds
// every expert, and the expert-parallel one (ExpertParallelMoE), which holds experts / ep
// of them; with expert tensor parallelism a slice of each expert's hidden layer.

#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "parts.hpp"

#include <string>
#include <vector>

namespace cubelm::tp::detail {

/// Rows [first, first + rows) of an expert-row buffer belong to local expert `expert`.
struct ExpertRows {
  int expert = 0;
  std::int64_t first = 0, rows = 0;
};

template <class T>
class ExpertBank {
public:
  /// Registers experts [first, first + count) of `names` (global indices) with GPT-2's
  /// MLP shape [hidden, ffn], [ffn], [ffn, hidden], [hidden] (ffn = 4 hidden), marked as
  /// experts' tensors.
  /// With expert tensor parallelism (`etp` of more than one rank) rank t of it holds
  /// hidden-layer features [t f, (t + 1) f), f = ffn / etp: those columns of w1 and b1 and
  /// rows of w2; b2 is replicated over `etp` and added by its rank 0, so that the ranks'
  /// outputs are partial sums.
  ExpertBank(Params<T>& params, Workspace<T>& ws, const MoeNames& names, int first, int count,
             const MoeSizes& sizes, const comm::Group* etp) {
    CUBELM_ASSERT(first >= 0 && count >= 1 && first + count <= static_cast<int>(names.w1.size()),
                  "experts " + std::to_string(first) + " + " + std::to_string(count) +
                      " outside the layer's " + std::to_string(names.w1.size()));
    const bool sliced = etp != nullptr && etp->size() > 1;
    const std::int64_t hidden = sizes.hidden, ffn = 4 * hidden;
    const std::int64_t f = sliced ? ffn / etp->size() : ffn, f0 = sliced ? etp->rank() * f : 0;
    const std::uint64_t seed = sizes.seed;
    ffn_ = f;
    leader_ = !sliced || etp->rank() == 0;
    auto add = [&](const std::string& name, std::vector<std::int64_t> dims,
                   std::vector<std::int64_t> offset, std::vector<std::int64_t> local, double sd) {
      Param<T>& p =
          Shared<T>::owned(params, make_param<T>(name, dims, offset, local, sd, 0, seed)).param();
      p.expert = true;
      return &p;
    };
    for (int i = first; i < first + count; ++i) {
      const auto k = static_cast<std::size_t>(i);
      w1_.push_back(add(names.w1[k], {hidden, ffn}, {0, f0}, {hidden, f}, sizes.std_dev));
      b1_.push_back(add(names.b1[k], {ffn}, {f0}, {f}, 0));
      w2_.push_back(add(names.w2[k], {ffn, hidden}, {f0, 0}, {f, hidden}, sizes.proj_std));
      if (sliced) {
        Param<T>& b2 = Shared<T>::replicated(
                           params, make_param<T>(names.b2[k], {hidden}, {0}, {hidden}, 0, 0, seed),
                           *etp, nullptr, ws)
                           .param();
        b2.expert = true;
        b2_.push_back(&b2);
      } else {
        b2_.push_back(add(names.b2[k], {hidden}, {0}, {hidden}, 0));
      }
    }
  }

  /// The hidden-layer features held here (ffn, or ffn / etp).
  std::int64_t ffn() const { return ffn_; }

  /// out = gelu(xin w1 + b1) w2 + b2 on each segment's rows with its expert; h, g and th
  /// keep the hidden layer, its GELU and tanh. `used`: the rows the segments cover, from 0.
  void forward(const ExecSpace& exec, const std::vector<ExpertRows>& segments, const Mat<T>& xin,
               const Mat<T>& h, const Mat<T>& g, const Mat<T>& th, const Mat<T>& out,
               std::int64_t used) const {
    using namespace kernels;
    for (const ExpertRows& r : segments) {
      const Mat<T> hr = rows(h, r);
      gemm<T>(exec, false, false, T(1), rows(xin, r), w1(r)->mat(), T(0), hr);
      bias_add<T>(exec, hr, b1_[idx(r)]->weights());
    }
    gelu_forward<T>(exec, head(h, used), head(g, used), head(th, used));
    for (const ExpertRows& r : segments) {
      const Mat<T> o = rows(out, r);
      gemm<T>(exec, false, false, T(1), rows(g, r), w2_[idx(r)]->mat(), T(0), o);
      if (leader_)
        bias_add<T>(exec, o, b2_[idx(r)]->weights());
    }
  }

  /// Adds the experts' parameter gradients for the outputs' gradient `dout` and replaces
  /// dout by the inputs' gradient; dhid is scratch of the hidden layer's width.
  void backward(const ExecSpace& exec, const std::vector<ExpertRows>& segments, const Mat<T>& xin,
                const Mat<T>& h, const Mat<T>& g, const Mat<T>& th, const Mat<T>& dout,
                const Mat<T>& dhid, std::int64_t used) const {
    using namespace kernels;
    for (const ExpertRows& r : segments) {
      const Mat<T> d = rows(dout, r);
      gemm<T>(exec, true, false, T(1), rows(g, r), d, T(1), w2_[idx(r)]->grad_mat());
      bias_backward<T>(exec, d, b2_[idx(r)]->grad);
      gemm<T>(exec, false, true, T(1), d, w2_[idx(r)]->mat(), T(0), rows(dhid, r));
    }
    gelu_backward<T>(exec, head(h, used), head(th, used), head(dhid, used), head(dhid, used));
    for (const ExpertRows& r : segments) {
      const Mat<T> d = rows(dhid, r);
      gemm<T>(exec, true, false, T(1), rows(xin, r), d, T(1), w1(r)->grad_mat());
      bias_backward<T>(exec, d, b1_[idx(r)]->grad);
      gemm<T>(exec, false, true, T(1), d, w1(r)->mat(), T(0), rows(dout, r));
    }
  }

  /// The first `n` rows of a buffer.
  static Mat<T> head(const Mat<T>& m, std::int64_t n) { return Mat<T>(m.data(), n, m.extent(1)); }

private:
  static std::size_t idx(const ExpertRows& r) { return static_cast<std::size_t>(r.expert); }
  Param<T>* w1(const ExpertRows& r) const { return w1_[idx(r)]; }
  static Mat<T> rows(const Mat<T>& m, const ExpertRows& r) {
    return Mat<T>(m.data() + r.first * m.extent(1), r.rows, m.extent(1));
  }

  std::vector<Param<T>*> w1_, b1_, w2_, b2_;
  std::int64_t ffn_ = 0;
  bool leader_ = true; // adds b2
};

} // namespace cubelm::tp::detail
