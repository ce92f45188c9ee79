#pragma once
/// \file
/// \brief One tensor-parallel interface, several modes (docs/tensor-parallel.md).
///
/// A Mode owns the layouts and the collectives of its tensor-parallel group;
/// the model is written once against it and never asks which mode it has.
/// Activations come in two layouts: the residual stream ("outer": what a
/// LayerNorm reads and the second linear of a pair writes, outer_rows x
/// outer_cols) and the inside of a pair ("inner": q, k, v, the attention
/// output, the MLP hidden layer, sequences x seq rows of inner_cols). A
/// LayerNorm's output, the input of a pair's first linear, has the inner rows
/// and the outer columns. Without sequence parallelism all of them hold the same
/// number of whole sequences (not necessarily the same ones: in 3D they differ)
/// and whole heads, so attention and elementwise layers run locally; with it (1d)
/// the residual stream holds a block of the rows, and a LayerNorm gathers its
/// output's rows (the gradient handed back to it is then the ranks' partial sum,
/// which it reduce-scatters). Token ids are passed for the whole micro-batch;
/// each mode takes the sequences it needs.

#include "cubelm/comm/grid.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "cubelm/kernels/moe.hpp"
#include "cubelm/tp/buffers.hpp"
#include "cubelm/tp/param.hpp"
#include "cubelm/tp/shapes.hpp"

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace cubelm::tp {

using kernels::Mat;
using kernels::Vec;

/// \brief All parameters of a model; a deque, so references to elements stay valid.
template <class T>
using Params = std::deque<Param<T>>;

/// \brief The first or the second linear of a pair (QKV then output projection,
/// W1 then W2): in 1D column- then row-parallel, in 3D one direction then the swapped one.
enum class Role { first, second };

/// \brief One or more linear maps that share their input: y_i = x W_i + b_i.
template <class T>
class Linear {
public:
  virtual ~Linear() = default;
  virtual void forward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& y) = 0;
  /// \brief Adds the weight and bias gradients; assigns dx, complete in this rank's layout.
  virtual void backward(const ExecSpace& exec, const Mat<T>& x, const std::vector<Mat<T>>& dy,
                        const Mat<T>& dx) = 0;
};

/// \brief LayerNorm over the features of the residual stream (eps 1e-5).
///
/// The row statistics go to `saved` (2 x rows: the means, then the reciprocal
/// standard deviations, in the compute type), which the caller owns and hands back to backward: one
/// per micro-batch in flight.
template <class T>
class LayerNorm {
public:
  virtual ~LayerNorm() = default;
  virtual void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y,
                       const Vec<compute_t<T>>& saved) = 0;
  /// \brief Adds the gamma/beta gradients; adds the input gradient to dx.
  virtual void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                        const Vec<compute_t<T>>& saved) = 0;
};

/// \brief Which ends of the model an Embedding serves: the token and position
/// lookup (first pipeline stage), the tied head and loss (last stage), or both.
enum class Ends { both, lookup, head };

/// \brief Token and position embedding, the tied LM head and the cross-entropy,
/// vocabulary-parallel: full logits are gathered only by logits(), a row at a time.
template <class T>
class Embedding {
public:
  virtual ~Embedding() = default;
  /// \brief x = wte[tokens] + wpe for this rank's rows (`tokens`: the whole micro-batch,
  /// batch x seq ids).
  virtual void forward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
                       const Mat<T>& x) = 0;
  /// \brief Adds the wte and wpe gradients from dx (`tokens`: those of the forward).
  virtual void backward(const ExecSpace& exec, const std::vector<std::int32_t>& tokens,
                        const Mat<T>& dx) = 0;
  /// \brief Sum over the whole micro-batch of the token losses of logits = h wte^T
  /// (`targets`: the whole micro-batch),
  /// the same on every rank of the group. With grad_scale != 0, assigns dh and adds
  /// grad_scale x the wte gradient of the loss sum.
  virtual double loss(const ExecSpace& exec, const Mat<T>& h,
                      const std::vector<std::int32_t>& targets, compute_t<T> grad_scale,
                      const Mat<T>& dh) = 0;
  /// \brief For generation: the logits h wte^T of the one row whose mark is non-zero
  /// (`marks`: the whole micro-batch, laid out as loss()'s targets), over the real
  /// vocabulary, into `out` on every rank of the group. The one place full logits are
  /// gathered, a row at a time.
  virtual void logits(const ExecSpace& exec, const Mat<T>& h,
                      const std::vector<std::int32_t>& marks, const Vec<float>& out) = 0;
};

/// \brief The parameter names of an MoE feed-forward (cost/shape.hpp spells them):
/// the router and, per global expert index, the expert MLP's four tensors.
struct MoeNames {
  std::string router;
  std::vector<std::string> w1, b1, w2, b2;
};

/// \brief The routing settings of an MoE feed-forward (docs/model.md).
struct MoeShape {
  int experts = 2;
  int top_k = 2;
  double capacity_factor = 0; ///< 0: dropless
  double aux_loss = 0;        ///< the load-balancing loss coefficient
};

/// \brief A Mixture-of-Experts feed-forward: a router [H, E] with softmax and top-k, and
/// E expert MLPs of the GPT-2 shape; y = sum over the chosen experts of gate x expert(x).
template <class T>
class MoE {
public:
  virtual ~MoE() = default;
  /// \brief The buffers one micro-batch keeps from forward to backward.
  virtual kernels::MoeSaved<T> make_saved() const = 0;
  /// \brief Assigns y = MoE(x), keeping what backward needs in `saved`; adds N x the
  /// load-balancing loss of this micro-batch (N its tokens) to aux(0) unless aux is empty.
  virtual void forward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& y,
                       kernels::MoeSaved<T>& saved, const Kokkos::View<double*, MemSpace>& aux) = 0;
  /// \brief Adds the parameter gradients of grad_scale x (loss sum + N x aux loss), the
  /// loss sum's part arriving as dy; assigns dx. The routing is that of the forward.
  virtual void backward(const ExecSpace& exec, const Mat<T>& x, const Mat<T>& dy, const Mat<T>& dx,
                        kernels::MoeSaved<T>& saved, compute_t<T> grad_scale) = 0;
};

/// \brief A tensor-parallel mode on one rank.
template <class T>
class Mode {
public:
  virtual ~Mode() = default;
  virtual const char* name() const = 0;
  /// \brief The process grid the mode's group belongs to.
  const comm::Layout& layout() const { return layout_; }
  /// \brief The ranks that share this rank's sequences (context parallelism, "cp"), or
  /// nullptr without it. The tensor-parallel layers never see it: they work on the
  /// tokens here; attention and the positions of the tokens do.
  const comm::Group* context() const { return context_; }
  /// \brief The positions of the tokens of a `seq_len`-token sequence held here.
  kernels::Positions positions(int seq_len) const {
    if (context_ == nullptr)
      return kernels::Positions(seq_len);
    return kernels::Positions(seq_len / context_->size(), context_->size(), context_->rank());
  }
  /// \brief How many of a micro-batch's `batch` sequences the activations inside a pair
  /// hold here (and a LayerNorm's output, the input of a pair's first linear).
  int sequences(int batch) const { return batch / split_.sequences; }
  /// \brief Rows of the residual stream here for micro-batches of `batch` sequences of
  /// `seq` tokens: sequences(batch) * seq, or a block of them with sequence parallelism.
  std::int64_t outer_rows(int batch, int seq) const {
    return static_cast<std::int64_t>(sequences(batch)) * seq / split_.stream_rows;
  }
  /// \brief Local columns of a residual-stream activation with `features` features.
  std::int64_t outer_cols(std::int64_t features) const { return features / split_.outer; }
  /// \brief Local columns of an activation inside a pair with `features` features.
  std::int64_t inner_cols(std::int64_t features) const { return features / split_.inner; }
  /// \brief Attention heads held by this rank.
  int local_heads(int heads) const { return heads / split_.heads; }

  /// \brief Registers W_i [in, out] and b_i [out] (names in `weights` and `biases`) and
  /// returns the layer computing them for activations of `rows` local rows.
  virtual std::unique_ptr<Linear<T>> linear(Params<T>& params,
                                            const std::vector<std::string>& weights,
                                            const std::vector<std::string>& biases, std::int64_t in,
                                            std::int64_t out, std::int64_t rows, Role role,
                                            double std_dev, std::uint64_t seed) = 0;
  /// \brief A LayerNorm of `features` features over residual-stream blocks of `rows`
  /// rows (outer_rows).
  virtual std::unique_ptr<LayerNorm<T>> layernorm(Params<T>& params, const std::string& prefix,
                                                  std::int64_t features, std::int64_t rows) = 0;
  /// \brief `batch`: sequences per micro-batch (all of them, not this rank's share);
  /// `pos`: the positions of each sequence's tokens here (all of them without context
  /// parallelism): the token ids handed to the embedding are those tokens, batch x
  /// pos.local of them, and wpe is [pos.total(), hidden].
  /// wte is registered for every `ends`, [padded, hidden] with the rows from `vocab` on
  /// zero, never predicted and never stored (tp::padded_vocab); wpe and the lookup's
  /// buffers only with a lookup, the logits and the loss's buffers only with a head.
  virtual std::unique_ptr<Embedding<T>> embedding(Params<T>& params, int vocab, int padded,
                                                  kernels::Positions pos, std::int64_t hidden,
                                                  int batch, std::uint64_t seed, Ends ends) = 0;
  /// \brief Registers the router and the experts (names in `names`) and returns the MoE
  /// feed-forward for `rows` local rows of `hidden` features (a LayerNorm's output in, the
  /// residual stream's layout out); w1 is initialised with std_dev, w2 with proj_std. The
  /// experts spread over the grid's "ep" group when expert_size > 1, which under tensor
  /// parallelism spans the tensor ranks, each routing an equal share of the tokens whole
  /// (docs/grid.md#expert-parallelism).
  virtual std::unique_ptr<MoE<T>> moe(Params<T>& params, const MoeNames& names,
                                      const MoeShape& shape, std::int64_t hidden, std::int64_t rows,
                                      double std_dev, double proj_std, std::uint64_t seed) = 0;
  /// \brief Bytes of the buffers the mode's layers allocated (saved statistics, gathered
  /// blocks, logits, scratch shared by all layers).
  virtual std::int64_t workspace_bytes() const = 0;
  /// \brief Compares the buffers the mode's parts allocated and reserved with their
  /// description (tp/buffers.hpp) for a stage of `parts`, name by name, and throws
  /// InternalError naming the first that differs.
  virtual void check_buffers(const StageParts& parts) const = 0;
  /// \brief The counters every collective of the grid's groups adds to.
  const comm::TrafficCounters& traffic() const { return *traffic_; }

protected:
  explicit Mode(const comm::ProcessGrid& grid)
      : layout_(grid.layout()), split_(activation_split(grid.layout())),
        context_(grid.layout().cp > 1 ? &grid.cp() : nullptr), traffic_(&grid.tp().traffic()) {}

private:
  comm::Layout layout_;
  ActivationSplit split_; // tp/shapes.hpp: how the mode splits activations
  const comm::Group* context_ = nullptr;
  const comm::TrafficCounters* traffic_;
};

/// \brief The mode of the grid's layout: "none" and "1d" are Megatron-style 1D
/// parallelism (none is its one-rank case), "2d" SUMMA, "3d" the cube.
template <class T>
std::unique_ptr<Mode<T>> make_mode(const comm::ProcessGrid& grid);

} // namespace cubelm::tp
