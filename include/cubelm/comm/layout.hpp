#pragma once
/// \file
/// \brief Sizes and coordinates of the dp x pp x cp x tp process grid: pure arithmetic,
/// no MPI and no Kokkos, so that deck validation can use it anywhere.
///
/// world = dp * pp * cp * tp. Rank order, fastest first: tp, cp, dp, pp, so
/// world_rank = t + tp * (c + cp * (d + dp * s)). The cp ranks of one data-parallel
/// index d hold the same sequences (each a share of their tokens) and the same
/// parameters: the replicas of a stage's parameters are the dp * cp ranks of one (t, s),
/// their replica index c + cp * d. See docs/grid.md and comm/grid.hpp.

#include "cubelm/core/config.hpp"

#include <string>
#include <vector>

namespace cubelm::comm {

/// \brief The three axes of the 3D cube.
enum class Axis { a, b, c };
/// \brief The three planes of the 3D cube.
enum class Plane { ab, bc, ca };

/// \brief Sizes of the process grid; pure arithmetic, no MPI.
struct Layout {
  int dp = 1;
  int pp = 1;
  int tp = 1;
  TensorMode mode = TensorMode::none;
  /// 1d only: the residual stream split over the tp ranks along its rows (tokens)
  bool sequence_parallel = false;
  /// MoE layers: the experts spread over ep ranks, the tp ranks of ep / tp consecutive
  /// replicas (expert_replicas()); dp * cp * tp / ep expert-data-parallel copies of each.
  /// With etp = tp: ep consecutive replicas of one tensor rank, dp * cp / ep copies.
  int ep = 1;
  /// MoE layers: each expert's hidden layer split over etp tensor ranks, 1 or tp
  int etp = 1;
  /// attention layers: each sequence split over cp ranks (context parallelism), which
  /// hold chunks c and 2 cp - 1 - c of its 2 cp chunks
  int cp = 1;

  int world_size() const { return dp * pp * cp * tp; }
  /// \brief The ranks of one (t, s) holding the same parameters: dp * cp.
  int replicas() const { return dp * cp; }
  /// \brief The replicas an expert-parallel group spans: ep / tp, or ep with expert tensor
  /// parallelism (1 without experts spread).
  int expert_replicas() const { return ep > 1 ? (etp > 1 ? ep : ep / tp) : 1; }
  /// \brief Copies of each expert (slice): the expert-data-parallel group's size.
  int expert_copies() const {
    return etp > 1 ? replicas() / expert_replicas() : replicas() * tp / ep;
  }
  /// \brief Side of the tp grid: p (1d), q with q*q = tp (2d), q with q^3 = tp (3d), 1 (none).
  int side() const;
  /// \brief e.g. "tp=3d:8 pp=1 dp=1", "tp=1d:4+sp pp=1 dp=1" with sequence parallelism,
  /// "... cp=2" and "... ep=4" with context and expert parallelism.
  std::string describe() const;

  /// \brief Throws a collective cubelm::Error naming the rule and valid values
  /// when the sizes are not positive or tp does not fit the mode.
  void validate() const;
  /// \brief validate(), and the world size must be dp*pp*cp*tp; the error suggests
  /// launch sizes and layouts that fit `world_size`.
  void validate_for_world(int world_size) const;
};

/// \brief The process grid the parallel keys of a deck describe.
Layout layout_of(const ParallelConfig& parallel);

/// \brief Whether `mode` can split the residual stream's rows over its ranks (sequence
/// parallelism): 1d only. The deck refuses sequence_parallel elsewhere; the planner tries it
/// where it splits anything (tp > 1).
bool splits_sequences(TensorMode mode);

/// \brief Where one rank sits in the grid. Unused sub-grid coordinates are 0.
struct GridCoords {
  int world = 0;
  int dp = 0; ///< the data-parallel index d: which sequences
  int pp = 0;
  int tp = 0;
  int cp = 0;      ///< the context-parallel index c: which chunks of them
  int replica = 0; ///< c + cp * d: the index among the replicas of the parameters
  int row = 0;     ///< 2d: i
  int col = 0;     ///< 2d: j
  int a = 0;       ///< 3d
  int b = 0;       ///< 3d
  int c = 0;       ///< 3d
  int ep = 0;      ///< index in the expert-parallel group: t + tp (replica % (ep / tp)), or
                   ///< replica % ep with expert tensor parallelism
  int edp = 0;     ///< index in the expert-data-parallel group: replica / expert_replicas()
};

/// \brief Coordinates of `world_rank` in `layout`.
GridCoords coords_of(const Layout& layout, int world_rank);
/// \brief The pipeline stage `world_rank` holds under `parallel`.
int stage_of(const ParallelConfig& parallel, int world_rank);
/// \brief The MoE layers' groups (ep > 1): ranks of equal ep_color form an "ep" group
/// (ordered by GridCoords::ep), of equal edp_color an "edp" group (ordered by edp).
int ep_color(const Layout& layout, const GridCoords& g);
int edp_color(const Layout& layout, const GridCoords& g);
/// \brief One process group a rank belongs to: the ranks of equal `color` form the group
/// `name`, ordered by `key`.
struct Membership {
  const char* name;
  int color;
  int key;
};
/// \brief Every group of the grid that the rank at `g` belongs to, world aside, in the order
/// ProcessGrid creates them: "tp", "dp", "pp", "pp.ends" (the first and last stage of one
/// pipeline; every other rank alone), "cp" (cp > 1), "ep" and "edp" (ep > 1), then 2d's
/// "tp.row" and "tp.col" or 3d's "tp.a", "tp.b", "tp.c", "tp.ab", "tp.bc" and "tp.ca".
/// The grid splits the world by them; the predictor places them on nodes.
std::vector<Membership> memberships(const Layout& layout, const GridCoords& g);
/// \brief The tensor sizes of `mode` that divide `ranks`, from 2 up ({1} for none).
std::vector<int> tensor_sizes(TensorMode mode, int ranks);
/// \brief The world rank at grid position (d, s, t, c) = (dp, pp, tp, cp index).
int world_rank_of(const Layout& layout, int dp, int pp, int tp, int cp = 0);
/// \brief tp index of 3d coordinates (a, b, c).
int tp_rank_3d(int q, int a, int b, int c);

} // namespace cubelm::comm
