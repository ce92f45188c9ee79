#pragma once
/// \file
/// \brief Sizes and coordinates of the dp x pp x tp process grid: pure arithmetic,
/// no MPI and no Kokkos, so that deck validation can use it anywhere.
///
/// world = dp * pp * tp. Rank order, fastest first: tp, dp, pp, so
/// world_rank = t + tp * (d + dp * s). See docs/grid.md and comm/grid.hpp.

#include "cubelm/core/config.hpp"

#include <string>

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
  /// MoE layers: each data-parallel group of dp ranks is ep groups of expert parallelism
  /// (consecutive dp indices) times dp / ep expert-data-parallel replicas
  int ep = 1;

  int world_size() const { return dp * pp * tp; }
  /// \brief Side of the tp grid: p (1d), q with q*q = tp (2d), q with q^3 = tp (3d), 1 (none).
  int side() const;
  /// \brief e.g. "tp=3d:8 pp=1 dp=1", "tp=1d:4+sp pp=1 dp=1" with sequence parallelism.
  std::string describe() const;

  /// \brief Throws a collective cubelm::Error naming the rule and valid values
  /// when the sizes are not positive or tp does not fit the mode.
  void validate() const;
  /// \brief validate(), and the world size must be dp*pp*tp; the error suggests
  /// launch sizes and layouts that fit `world_size`.
  void validate_for_world(int world_size) const;
};

/// \brief The process grid the parallel keys of a deck describe.
Layout layout_of(const ParallelConfig& parallel);

/// \brief Where one rank sits in the grid. Unused sub-grid coordinates are 0.
struct GridCoords {
  int world = 0;
  int dp = 0;
  int pp = 0;
  int tp = 0;
  int row = 0; ///< 2d: i
  int col = 0; ///< 2d: j
  int a = 0;   ///< 3d
  int b = 0;   ///< 3d
  int c = 0;   ///< 3d
  int ep = 0;  ///< index in the expert-parallel group: dp % ep
  int edp = 0; ///< index in the expert-data-parallel group: dp / ep
};

/// \brief Coordinates of `world_rank` in `layout`.
GridCoords coords_of(const Layout& layout, int world_rank);
/// \brief The world rank at grid position (d, s, t) = (dp, pp, tp index).
int world_rank_of(const Layout& layout, int dp, int pp, int tp);
/// \brief tp index of 3d coordinates (a, b, c).
int tp_rank_3d(int q, int a, int b, int c);

} // namespace cubelm::comm
