#pragma once
/// \file
/// \brief The dp x pp x tp process grid and the tensor-parallel sub-grids.
///
/// world = dp * pp * tp. Rank order, fastest first: tp, dp, pp, so
/// world_rank = t + tp * (d + dp * s) and tensor-parallel neighbours share a node.
/// Inside tp:
///  - 1d: one axis of size p = tp.
///  - 2d: tp = q*q, t = i*q + j with row i and column j; group "tp.row" holds
///        the ranks of row i (fixed i, ordered by j), "tp.col" column j (ordered by i).
///  - 3d: tp = q*q*q, t = a + q*(b + q*c); groups "tp.a", "tp.b", "tp.c" vary one
///        axis (ordered by it) and "tp.ab" (fixed c, order a + q*b), "tp.bc"
///        (fixed a, order b + q*c), "tp.ca" (fixed b, order c + q*a) are the planes.

#include "cubelm/comm/group.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cubelm::comm {

/// \brief The tensor-parallel mode.
enum class TensorMode { none, d1, d2, d3 };

/// \brief "none", "1d", "2d", "3d".
const char* mode_name(TensorMode mode);
/// \brief Parses "none"/"1d"/"2d"/"3d"; std::nullopt otherwise.
std::optional<TensorMode> parse_mode(const std::string& text);

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

  int world_size() const { return dp * pp * tp; }
  /// \brief Side of the tp grid: p (1d), q with q*q = tp (2d), q with q^3 = tp (3d), 1 (none).
  int side() const;
  /// \brief e.g. "tp=3d:8 pp=1 dp=1".
  std::string describe() const;

  /// \brief Throws a collective cubelm::Error naming the rule and valid values
  /// when the sizes are not positive or tp does not fit the mode.
  void validate() const;
  /// \brief validate(), and the world size must be dp*pp*tp; the error suggests
  /// launch sizes and layouts that fit `world_size`.
  void validate_for_world(int world_size) const;
};

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
};

/// \brief Coordinates of `world_rank` in `layout`.
GridCoords coords_of(const Layout& layout, int world_rank);
/// \brief The world rank at grid position (d, s, t) = (dp, pp, tp index).
int world_rank_of(const Layout& layout, int dp, int pp, int tp);
/// \brief tp index of 3d coordinates (a, b, c).
int tp_rank_3d(int q, int a, int b, int c);

/// \brief The communicators of one rank's grid position, with shared traffic counters.
class ProcessGrid {
public:
  ProcessGrid(const Layout& layout, const Communicator& world,
              CommOptions options = CommOptions::from_environment());

  const Layout& layout() const { return layout_; }
  const GridCoords& coords() const { return coords_; }

  const Group& world() const { return *world_; }
  const Group& tp() const { return *tp_; }
  const Group& dp() const { return *dp_; }
  const Group& pp() const { return *pp_; }
  /// \brief 2d only: the ranks of this rank's row / column.
  const Group& tp_row() const;
  const Group& tp_col() const;
  /// \brief 3d only: the ranks along one axis / in one plane through this rank.
  const Group& tp_axis(Axis axis) const;
  const Group& tp_plane(Plane plane) const;

  TrafficCounters& traffic() { return *traffic_; }
  const TrafficCounters& traffic() const { return *traffic_; }

private:
  const Group& need(const std::optional<Group>& group, const char* what) const;

  Layout layout_;
  GridCoords coords_;
  std::shared_ptr<TrafficCounters> traffic_;
  std::optional<Group> world_, tp_, dp_, pp_;
  std::optional<Group> row_, col_;
  std::optional<Group> axis_[3], plane_[3];
};

} // namespace cubelm::comm
