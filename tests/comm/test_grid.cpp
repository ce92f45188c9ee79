// The process grid: coordinates and group membership of every rank for every
// layout that fits the job, checked against the rank formulas of docs/grid.md
// written out again here (w = t + tp (d + dp s); 2d t = i q + j; 3d t = a + q (b + q c)),
// including the group of the first and last pipeline stage ("pp.ends").

#include "cubelm/comm/grid.hpp"
#include "cubelm/core/error.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::comm;

namespace {

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Every layout (mode, dp, pp, tp) with dp*pp*tp == n that the mode accepts.
std::vector<Layout> layouts_for(int n) {
  std::vector<Layout> out;
  for (TensorMode mode : {TensorMode::none, TensorMode::d1, TensorMode::d2, TensorMode::d3})
    for (int tp = 1; tp <= n; ++tp)
      for (int dp = 1; dp <= n; ++dp)
        for (int pp = 1; pp <= n; ++pp) {
          if (dp * pp * tp != n)
            continue;
          Layout l{dp, pp, tp, mode};
          try {
            l.validate();
          } catch (const Error&) {
            continue;
          }
          out.push_back(l);
        }
  return out;
}

// World ranks of the members of `group`, in group-rank order (raw MPI, independent of Group).
std::vector<int> members(const Group& group) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::vector<int> all(static_cast<std::size_t>(group.size()));
  MPI_Allgather(&me, 1, MPI_INT, all.data(), 1, MPI_INT, group.communicator().raw());
  return all;
}

struct Expect {
  const Layout& l;
  int d, s; // this rank's dp and pp coordinates
  int w(int t) const { return t + l.tp * (d + l.dp * s); }
};

} // namespace

TEST(GridLayout, CoordinatesRoundTripForAllLayoutsUpTo27) {
  for (int n = 1; n <= 27; ++n)
    for (const Layout& l : layouts_for(n))
      for (int r = 0; r < n; ++r) {
        const GridCoords g = coords_of(l, r);
        EXPECT_EQ(g.world, r);
        EXPECT_EQ(g.tp + l.tp * (g.dp + l.dp * g.pp), r) << l.describe();
        EXPECT_EQ(world_rank_of(l, g.dp, g.pp, g.tp), r);
        const int q = l.side();
        if (l.mode == TensorMode::d2) {
          EXPECT_EQ(q * q, l.tp);
          EXPECT_EQ(g.row * q + g.col, g.tp);
        }
        if (l.mode == TensorMode::d3) {
          EXPECT_EQ(q * q * q, l.tp);
          EXPECT_EQ(g.a + q * (g.b + q * g.c), g.tp);
          EXPECT_EQ(tp_rank_3d(q, g.a, g.b, g.c), g.tp);
        }
      }
}

TEST(GridLayout, RefusesNonSquareAndNonCubeWithNearestValues) {
  try {
    Layout{1, 1, 8, TensorMode::d2}.validate();
    FAIL() << "tp=8 in 2d was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_NE(std::string(e.what()).find("square"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 (2x2) or 9 (3x3)"), std::string::npos) << e.what();
  }
  try {
    Layout{1, 1, 4, TensorMode::d3}.validate();
    FAIL() << "tp=4 in 3d was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 (1x1x1) or 8 (2x2x2)"), std::string::npos) << e.what();
  }
  EXPECT_THROW((Layout{1, 1, 2, TensorMode::none}.validate()), Error);
  EXPECT_THROW((Layout{0, 1, 1, TensorMode::none}.validate()), Error);
  EXPECT_NO_THROW((Layout{1, 1, 27, TensorMode::d3}.validate()));
  EXPECT_NO_THROW((Layout{1, 1, 9, TensorMode::d2}.validate()));
  EXPECT_NO_THROW((Layout{1, 1, 6, TensorMode::d1}.validate()));
}

TEST(GridLayout, WorldMismatchNamesTheRuleAndAlternatives) {
  const Layout l{1, 1, 4, TensorMode::d1};
  EXPECT_NO_THROW(l.validate_for_world(4));
  try {
    l.validate_for_world(6);
    FAIL() << "6 processes accepted for a 4-process layout";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("6 processes"), std::string::npos) << m;
    EXPECT_NE(m.find("1 x 1 x 4 = 4"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor_size = 6"), std::string::npos) << m;
  }
  try {
    Layout{1, 1, 8, TensorMode::d3}.validate_for_world(16);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("data_size = 2"), std::string::npos) << m;
    EXPECT_NE(m.find("pipeline_size = 2"), std::string::npos) << m;
    EXPECT_EQ(m.find("tensor_size = 16"), std::string::npos) << m; // 16 is no cube
  }
}

TEST(ProcessGrid, EveryLayoutOfThisJobHasTheRightGroups) {
  const int n = world_size();
  const std::vector<Layout> layouts = layouts_for(n);
  ASSERT_FALSE(layouts.empty());
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.describe());
    const ProcessGrid grid(l, Communicator::world());
    const GridCoords& g = grid.coords();
    // Coordinates from the formulas, written out independently.
    EXPECT_EQ(g.tp, me % l.tp);
    EXPECT_EQ(g.dp, (me / l.tp) % l.dp);
    EXPECT_EQ(g.pp, me / (l.tp * l.dp));
    const Expect x{l, g.dp, g.pp};

    EXPECT_EQ(grid.world().size(), n);
    EXPECT_EQ(grid.world().rank(), me);

    std::vector<int> tp, dp, pp;
    for (int t = 0; t < l.tp; ++t)
      tp.push_back(x.w(t));
    for (int d = 0; d < l.dp; ++d)
      dp.push_back(g.tp + l.tp * (d + l.dp * g.pp));
    for (int s = 0; s < l.pp; ++s)
      pp.push_back(g.tp + l.tp * (g.dp + l.dp * s));
    EXPECT_EQ(members(grid.tp()), tp);
    EXPECT_EQ(members(grid.dp()), dp);
    EXPECT_EQ(members(grid.pp()), pp);
    EXPECT_EQ(grid.tp().rank(), g.tp);
    EXPECT_EQ(grid.dp().rank(), g.dp);
    EXPECT_EQ(grid.pp().rank(), g.pp);

    // pp.ends: this (t, d) pipeline's first and last stage, first stage first;
    // this rank alone on the other stages and when pp == 1.
    std::vector<int> ends{me};
    if (l.pp > 1 && (g.pp == 0 || g.pp == l.pp - 1))
      ends = {g.tp + l.tp * g.dp, g.tp + l.tp * (g.dp + l.dp * (l.pp - 1))};
    EXPECT_EQ(members(grid.embedding()), ends);
    EXPECT_EQ(grid.embedding().rank(), g.pp == 0 || ends.size() == 1 ? 0 : 1);
    EXPECT_EQ(grid.embedding().name(), "pp.ends");

    const int q = l.side();
    if (l.mode == TensorMode::d2) {
      const int i = g.tp / q, j = g.tp % q;
      EXPECT_EQ(g.row, i);
      EXPECT_EQ(g.col, j);
      std::vector<int> row, col;
      for (int k = 0; k < q; ++k) {
        row.push_back(x.w(i * q + k));
        col.push_back(x.w(k * q + j));
      }
      EXPECT_EQ(members(grid.tp_row()), row);
      EXPECT_EQ(members(grid.tp_col()), col);
      EXPECT_EQ(grid.tp_row().name(), "tp.row");
    } else {
      EXPECT_THROW(grid.tp_row(), InternalError);
    }
    if (l.mode == TensorMode::d3) {
      const int a = g.tp % q, b = (g.tp / q) % q, c = g.tp / (q * q);
      EXPECT_EQ(g.a, a);
      EXPECT_EQ(g.b, b);
      EXPECT_EQ(g.c, c);
      auto t3 = [&](int aa, int bb, int cc) { return x.w(aa + q * (bb + q * cc)); };
      std::vector<int> ga, gb, gc, ab, bc, ca;
      for (int k = 0; k < q; ++k) {
        ga.push_back(t3(k, b, c));
        gb.push_back(t3(a, k, c));
        gc.push_back(t3(a, b, k));
      }
      for (int k = 0; k < q * q; ++k) {
        ab.push_back(t3(k % q, k / q, c)); // order a + q b
        bc.push_back(t3(a, k % q, k / q)); // order b + q c
        ca.push_back(t3(k / q, b, k % q)); // order c + q a
      }
      EXPECT_EQ(members(grid.tp_axis(Axis::a)), ga);
      EXPECT_EQ(members(grid.tp_axis(Axis::b)), gb);
      EXPECT_EQ(members(grid.tp_axis(Axis::c)), gc);
      EXPECT_EQ(members(grid.tp_plane(Plane::ab)), ab);
      EXPECT_EQ(members(grid.tp_plane(Plane::bc)), bc);
      EXPECT_EQ(members(grid.tp_plane(Plane::ca)), ca);
      EXPECT_EQ(grid.tp_axis(Axis::a).rank(), a);
      EXPECT_EQ(grid.tp_plane(Plane::ca).rank(), c + q * a);
    } else {
      EXPECT_THROW(grid.tp_axis(Axis::a), InternalError);
      EXPECT_THROW(grid.tp_plane(Plane::ab), InternalError);
    }
  }
}

TEST(ProcessGrid, EmbeddingGroupPairsTheEndsOfEachPipeline) {
  const int n = world_size();
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  // pp = 1, 2 and 4 where the job allows, with the rest of the ranks in tp or dp.
  for (int pp : {1, 2, 4}) {
    if (n % pp != 0)
      continue;
    for (const Layout& l :
         {Layout{n / pp, pp, 1, TensorMode::none}, Layout{1, pp, n / pp, TensorMode::d1}}) {
      SCOPED_TRACE(l.describe());
      const ProcessGrid grid(l, Communicator::world());
      const int s = grid.coords().pp;
      const bool end = pp > 1 && (s == 0 || s == pp - 1);
      EXPECT_EQ(grid.embedding().size(), end ? 2 : 1);
      // A tied-gradient sum: both ends get (first + 1) + (last + 1), the others their own.
      const int first = grid.coords().tp + l.tp * grid.coords().dp;
      const int last = first + l.tp * l.dp * (pp - 1);
      Kokkos::View<double*, Kokkos::HostSpace> grad("grad", 3);
      Kokkos::deep_copy(grad, me + 1.0);
      grid.embedding().all_reduce(Kokkos::DefaultHostExecutionSpace(), grad);
      EXPECT_EQ(grad(2), end ? first + last + 2.0 : me + 1.0);
      EXPECT_EQ(grid.traffic().calls("pp.ends", Kind::all_reduce), 1u);
    }
  }
}

TEST(ProcessGrid, RefusesAJobOfTheWrongSize) {
  const int n = world_size();
  const Layout l{1, 1, n + 1, TensorMode::d1};
  EXPECT_THROW(ProcessGrid(l, Communicator::world()), Error);
}

// Context parallelism: w = t + tp (c + cp (d + dp s)); "cp" holds the c of one (t, d, s),
// "dp" the replicas (every c and d of one (t, s), ordered by c + cp d), "pp" and
// "pp.ends" one (t, c, d); ep and edp fold the replica index.
TEST(ProcessGrid, ContextParallelLayoutsHaveTheRightGroups) {
  const int n = world_size();
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int tested = 0;
  for (int cp = 2; cp <= n; ++cp)
    for (int tp = 1; tp * cp <= n; ++tp)
      for (int dp = 1; dp * tp * cp <= n; ++dp) {
        if (n % (tp * cp * dp) != 0)
          continue;
        Layout l{dp, n / (tp * cp * dp), tp, tp > 1 ? TensorMode::d1 : TensorMode::none};
        l.cp = cp;
        // The experts over the tp ranks of f = 2 replicas where that divides (tp > 1:
        // folded; tp = 1 and f = 1: no expert groups).
        const int f = (dp * cp) % 2 == 0 ? 2 : 1;
        l.ep = tp * f;
        SCOPED_TRACE(l.describe());
        const ProcessGrid grid(l, Communicator::world());
        const GridCoords& g = grid.coords();
        const auto w = [&](int t, int c, int d, int s) { return t + tp * (c + cp * (d + dp * s)); };
        EXPECT_EQ(g.tp, me % tp);
        EXPECT_EQ(g.cp, (me / tp) % cp);
        EXPECT_EQ(g.dp, (me / (tp * cp)) % dp);
        EXPECT_EQ(g.pp, me / (tp * cp * dp));
        EXPECT_EQ(g.replica, g.cp + cp * g.dp);
        EXPECT_EQ(world_rank_of(l, g.dp, g.pp, g.tp, g.cp), me);
        std::vector<int> cps, dps, pps;
        for (int c = 0; c < cp; ++c)
          cps.push_back(w(g.tp, c, g.dp, g.pp));
        for (int d = 0; d < dp; ++d)
          for (int c = 0; c < cp; ++c)
            dps.push_back(w(g.tp, c, d, g.pp));
        for (int s = 0; s < l.pp; ++s)
          pps.push_back(w(g.tp, g.cp, g.dp, s));
        EXPECT_EQ(members(grid.cp()), cps);
        EXPECT_EQ(grid.cp().rank(), g.cp);
        EXPECT_EQ(members(grid.dp()), dps);
        EXPECT_EQ(grid.dp().rank(), g.replica);
        EXPECT_EQ(members(grid.pp()), pps);
        if (l.ep > 1) {
          // ep: index e = t + tp x over the tp ranks of replicas r f .. r f + f - 1; edp:
          // the ranks of one e, over r.
          EXPECT_EQ(g.ep, g.tp + tp * (g.replica % f));
          EXPECT_EQ(g.edp, g.replica / f);
          std::vector<int> eps, edps;
          const auto at = [&](int t, int x) { return w(t, x % cp, x / cp, g.pp); };
          for (int e = 0; e < l.ep; ++e)
            eps.push_back(at(e % tp, g.edp * f + e / tp));
          for (int r = 0; r < dp * cp / f; ++r)
            edps.push_back(at(g.ep % tp, r * f + g.ep / tp));
          EXPECT_EQ(members(grid.ep()), eps);
          EXPECT_EQ(grid.ep().rank(), g.ep);
          EXPECT_EQ(members(grid.expert_dp()), edps);
        }
        if (tp > 1 && f > 1) {
          // Expert tensor parallelism: each tensor rank's experts over f replicas of its own.
          Layout split = l;
          split.etp = tp;
          split.ep = f;
          const ProcessGrid sg(split, Communicator::world());
          const GridCoords& h = sg.coords();
          EXPECT_EQ(h.ep, h.replica % f);
          EXPECT_EQ(h.edp, h.replica / f);
          std::vector<int> eps, edps;
          const auto at = [&](int x) { return w(h.tp, x % cp, x / cp, h.pp); };
          for (int e = 0; e < f; ++e)
            eps.push_back(at(h.edp * f + e));
          for (int r = 0; r < dp * cp / f; ++r)
            edps.push_back(at(r * f + h.ep));
          EXPECT_EQ(members(sg.ep()), eps);
          EXPECT_EQ(sg.ep().rank(), h.ep);
          EXPECT_EQ(members(sg.expert_dp()), edps);
        }
        const auto names = grid.group_names();
        EXPECT_NE(std::find(names.begin(), names.end(), "cp"), names.end());
        ++tested;
      }
  if (n == 1)
    EXPECT_EQ(tested, 0);
  else
    EXPECT_GT(tested, 0);
  // Without context parallelism there is no cp group.
  const ProcessGrid plain(Layout{n, 1, 1, TensorMode::none}, Communicator::world());
  EXPECT_THROW(plain.cp(), InternalError);
}
