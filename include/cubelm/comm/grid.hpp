#pragma once
/// \file
/// \brief The dp x pp x cp x tp process grid and the tensor-parallel sub-grids.
///
/// world = dp * pp * cp * tp. Rank order, fastest first: tp, cp, dp, pp, so
/// world_rank = t + tp * (c + cp * (d + dp * s)) and tensor-parallel neighbours share a
/// node, context-parallel ones next. "cp" (context_size > 1) holds the ranks of one
/// (t, d, s), ordered by c: they split each sequence of the same micro-batches. "dp"
/// holds the replicas of the stage's parameters, every (c, d) of one (t, s) ordered by
/// the replica index c + cp * d: the gradients are reduced over it.
/// Inside tp:
///  - 1d: one axis of size p = tp.
///  - 2d: tp = q*q, t = i*q + j with row i and column j; group "tp.row" holds
///        the ranks of row i (fixed i, ordered by j), "tp.col" column j (ordered by i).
///  - 3d: tp = q*q*q, t = a + q*(b + q*c); groups "tp.a", "tp.b", "tp.c" vary one
///        axis (ordered by it) and "tp.ab" (fixed c, order a + q*b), "tp.bc"
///        (fixed a, order b + q*c), "tp.ca" (fixed b, order c + q*a) are the planes.
/// MoE layers with expert parallelism (ep > 1) fold the tp ranks and the replicas: with
/// f = ep / tp and replica index c + cp * d = x + f * r, "ep" holds the ep ranks of one
/// r, ordered by e = t + tp * x (the experts are spread over them), and "edp" those of
/// one e (ordered by r: replicas of the same experts).
/// Across pipeline stages, "pp.ends" (embedding()) pairs stage 0 with stage pp-1.

#include "cubelm/comm/group.hpp"
#include "cubelm/comm/layout.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cubelm::comm {

/// \brief The communicators of one rank's grid position, with shared traffic counters.
class ProcessGrid {
public:
  /// \brief Collective over `world`: splits it into the groups, then creates the NCCL
  /// communicators of those that carry device memory through NCCL, in one order on
  /// every rank (docs/communication.md).
  ProcessGrid(const Layout& layout, const Communicator& world,
              CommOptions options = CommOptions::from_environment());

  const Layout& layout() const { return layout_; }
  const GridCoords& coords() const { return coords_; }

  const Group& world() const { return *world_; }
  const Group& tp() const { return *tp_; }
  /// \brief The replicas of this stage's parameters: dp * cp ranks (the data-parallel
  /// group, with the context-parallel ranks folded in).
  const Group& dp() const { return *dp_; }
  /// \brief "cp": the ranks sharing this rank's sequences (context_size > 1 only).
  const Group& cp() const;
  const Group& pp() const { return *pp_; }
  /// \brief "pp.ends": the ranks with this rank's t and d on the first and on the
  /// last pipeline stage, first stage = group rank 0 (they sum the gradient of
  /// the word embedding tied between the two). Size 2 on those stages when
  /// pp > 1; on the other stages, and for pp == 1, this rank alone.
  const Group& embedding() const { return *embedding_; }
  /// \brief "ep": the ranks of this rank's data-parallel group that share the MoE
  /// layers' experts among them (ep > 1 only).
  const Group& ep() const;
  /// \brief The group over which the experts' gradients are reduced: "edp" (the ranks
  /// holding the same experts) with ep > 1, else dp.
  const Group& expert_dp() const { return edp_ ? *edp_ : *dp_; }
  /// \brief 2d only: the ranks of this rank's row / column.
  const Group& tp_row() const;
  const Group& tp_col() const;
  /// \brief 3d only: the ranks along one axis / in one plane through this rank.
  const Group& tp_axis(Axis axis) const;
  const Group& tp_plane(Plane plane) const;

  /// \brief A copy of world whose traffic is counted apart from the model's (the
  /// metrics' exchange of timings between ranks).
  const Group& metrics() const { return *metrics_; }
  /// \brief The names of this grid's groups (world, tp and its sub-groups, cp, dp, pp,
  /// pp.ends, ep, edp), in the same order on every rank.
  std::vector<std::string> group_names() const;

  TrafficCounters& traffic() { return *traffic_; }
  const TrafficCounters& traffic() const { return *traffic_; }

private:
  const Group& need(const std::optional<Group>& group, const char* what) const;

  Layout layout_;
  GridCoords coords_;
  std::shared_ptr<TrafficCounters> traffic_;
  std::optional<Group> world_, tp_, cp_, dp_, pp_, embedding_, metrics_, ep_, edp_;
  std::optional<Group> row_, col_;
  std::optional<Group> axis_[3], plane_[3];
};

} // namespace cubelm::comm
