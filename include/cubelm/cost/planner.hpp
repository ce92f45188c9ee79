#pragma once
/// \file
/// \brief Every layout of a deck's model on a number of ranks, predicted and ranked:
/// what `cubelm plan` prints (docs/planner.md). No Kokkos, no MPI.

#include "cubelm/core/config.hpp"
#include "cubelm/cost/predict.hpp"
#include "cubelm/io/machine.hpp"

#include <string>
#include <vector>

namespace cubelm::cost {

/// \brief Which layouts to consider besides the model's own rules.
struct SearchSpace {
  /// train.precision values to try; empty: the deck's own.
  std::vector<Precision> precisions;
  /// Tensor modes to try; empty: all four.
  std::vector<TensorMode> modes;
  /// Tensor and pipeline sizes, recompute settings to keep; empty: any.
  std::vector<int> tensor_sizes, pipeline_sizes;
  std::vector<Recompute> recompute;
  /// Context sizes to try (each with 2 x size dividing model.seq_len); empty: the deck's.
  std::vector<int> context_sizes;
};

/// \brief Every layout of `base`'s model and global batch on `ranks` ranks that its rules
/// allow (comm::Layout::validate, tp::check_shapes, pipeline::check_plan, the batch split):
/// each tensor mode and size, pipeline size, data size = the rest, micro-batch count (a
/// divisor of the sequences per replica), schedule (gpipe, 1f1b, layered, interleaved with
/// every virtual stage count that divides the layers; with one stage 1f1b, and layered
/// when there are several micro-batches and replicas: layered gradient accumulation),
/// ZeRO-1 where dp x cp > 1, recompute none or full, sequence parallelism in 1D, for each
/// context size of `space` (default `base`'s; data size = what tp, pp and cp leave). Other
/// keys as in `base`. cubelm::Error naming --ranks when `ranks` < 1.
std::vector<Deck> layouts(const Deck& base, int ranks, const SearchSpace& space = {});

/// \brief A layout and its prediction.
struct Candidate {
  Deck deck;
  Prediction prediction;
};

/// \brief What rank_layouts found.
struct Ranking {
  std::vector<Candidate> fit; ///< the layouts that fit in memory, fastest first
  std::size_t considered = 0; ///< layouts() of the model on these ranks
};

/// \brief The planner's order: the faster predicted step first; at the same step time,
/// the one that needs less memory per device.
bool ranks_before(const Prediction& a, const Prediction& b);

/// \brief The layouts() that fit in the machine's device memory, predicted on `machine`
/// and ranked by ranks_before: step time, fastest first, then memory.
Ranking rank_layouts(const Deck& base, int ranks, const io::Machine& machine,
                     const SearchSpace& space = {});

/// \brief The deck's [parallel] keys (and train.precision) as one line, e.g.
/// "tp=1d:8+sp pp=4 dp=2 1f1b m=16 zero=1 recompute=full bf16".
std::string layout_line(const Deck& deck);

} // namespace cubelm::cost
