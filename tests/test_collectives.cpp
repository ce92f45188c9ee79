// Collectives on Kokkos Views against closed forms, on the world and on every
// sub-grid group the job size allows; odd and zero lengths; the traffic counters.

#include "cubelm/comm/grid.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/types.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::comm;

namespace {

const std::size_t kLengths[] = {0, 1, 7, 13, 1000};

int world_size() {
  return Communicator::world().size();
}

template <class T>
View1<T> filled(std::size_t n, const std::function<T(std::size_t)>& f) {
  View1<T> v("v", n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < n; ++i)
    h(i) = f(i);
  Kokkos::deep_copy(v, h);
  return v;
}

template <class T>
std::vector<T> to_host(const View1<T>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<T>(h.data(), h.data() + h.extent(0));
}

// Runs `check` on the world group and on every sub-grid group of one layout
// per tensor mode that fits this job.
void for_each_group(const std::function<void(const Group&)>& check) {
  const int n = world_size();
  const Communicator world = Communicator::world();
  {
    const ProcessGrid grid(Layout{1, 1, n, TensorMode::d1}, world);
    SCOPED_TRACE("world");
    check(grid.world());
  }
  if (n % 2 == 0) {
    const ProcessGrid grid(Layout{2, n / 2, 1, TensorMode::none}, world);
    SCOPED_TRACE("dp and pp");
    check(grid.dp());
    check(grid.pp());
  }
  if (n % 4 == 0) {
    const ProcessGrid grid(Layout{n / 4, 1, 4, TensorMode::d2}, world);
    SCOPED_TRACE("2d row/col");
    check(grid.tp_row());
    check(grid.tp_col());
  }
  if (n % 8 == 0) {
    const ProcessGrid grid(Layout{n / 8, 1, 8, TensorMode::d3}, world);
    SCOPED_TRACE("3d axes and planes");
    for (Axis a : {Axis::a, Axis::b, Axis::c})
      check(grid.tp_axis(a));
    for (Plane p : {Plane::ab, Plane::bc, Plane::ca})
      check(grid.tp_plane(p));
  }
}

template <class T>
void all_reduce_sum_max_min(const Group& g) {
  const ExecSpace exec;
  const T p = static_cast<T>(g.size());
  const T r = static_cast<T>(g.rank());
  for (std::size_t n : kLengths) {
    auto v = filled<T>(n, [&](std::size_t i) { return (r + 1) * static_cast<T>(i + 1); });
    g.all_reduce(exec, v);
    const auto s = to_host(v);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(s[i], static_cast<T>(i + 1) * p * (p + 1) / 2) << g.name() << " n=" << n;

    auto m = filled<T>(n, [&](std::size_t i) { return r * 3 + static_cast<T>(i % 5); });
    g.all_reduce(exec, m, ReduceOp::max);
    const auto mx = to_host(m);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(mx[i], (p - 1) * 3 + static_cast<T>(i % 5));

    auto lo = filled<T>(n, [&](std::size_t i) { return r + static_cast<T>(i); });
    g.all_reduce(exec, lo, ReduceOp::min);
    const auto mn = to_host(lo);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(mn[i], static_cast<T>(i));
  }
}

} // namespace

TEST(Collectives, AllReduceSumMaxMinEveryType) {
  for_each_group([](const Group& g) {
    all_reduce_sum_max_min<float>(g);
    all_reduce_sum_max_min<double>(g);
    all_reduce_sum_max_min<std::int32_t>(g);
    all_reduce_sum_max_min<std::int64_t>(g);
  });
}

TEST(Collectives, AllReduceOnARank2View) {
  for_each_group([](const Group& g) {
    const ExecSpace exec;
    View2<double> m("m", 3, 5);
    Kokkos::deep_copy(m, static_cast<double>(g.rank() + 1));
    g.all_reduce(exec, m);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
    const double p = g.size();
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j)
        ASSERT_EQ(h(i, j), p * (p + 1) / 2);
  });
}

TEST(Collectives, AllGatherConcatenatesInRankOrder) {
  for_each_group([](const Group& g) {
    const ExecSpace exec;
    const int p = g.size();
    for (std::size_t n : kLengths) {
      auto send = filled<float>(n, [&](std::size_t i) { return 1000.0f * g.rank() + i; });
      View1<float> recv("recv", n * p);
      g.all_gather(exec, send, recv);
      const auto h = to_host(recv);
      for (int k = 0; k < p; ++k)
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(h[k * n + i], 1000.0f * k + i) << g.name();
    }
  });
}

TEST(Collectives, ReduceScatterGivesEachRankItsBlock) {
  for_each_group([](const Group& g) {
    const ExecSpace exec;
    const int p = g.size();
    const int r = g.rank();
    for (std::size_t n : kLengths) {
      auto send = filled<double>(n * p, [&](std::size_t j) { return (r + 1.0) * (j + 1.0); });
      View1<double> recv("recv", n);
      g.reduce_scatter(exec, send, recv);
      const auto h = to_host(recv);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(h[i], (r * n + i + 1.0) * p * (p + 1) / 2.0) << g.name();
    }
  });
}

TEST(Collectives, BroadcastFromEveryRoot) {
  for_each_group([](const Group& g) {
    const ExecSpace exec;
    for (int root = 0; root < g.size(); ++root)
      for (std::size_t n : kLengths) {
        auto v = filled<std::int32_t>(n, [&](std::size_t i) {
          return g.rank() == root ? static_cast<std::int32_t>(7 * root + i) : -1;
        });
        g.broadcast(exec, v, root);
        const auto h = to_host(v);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(h[i], static_cast<std::int32_t>(7 * root + i));
      }
  });
}

TEST(Collectives, ReduceToEveryRoot) {
  for_each_group([](const Group& g) {
    const ExecSpace exec;
    const double p = g.size();
    for (int root = 0; root < g.size(); ++root)
      for (std::size_t n : kLengths) {
        auto send = filled<double>(n, [&](std::size_t i) { return (g.rank() + 1.0) * i; });
        View1<double> recv("recv", g.rank() == root ? n : 0);
        g.reduce(exec, send, recv, root);
        if (g.rank() == root) {
          const auto h = to_host(recv);
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(h[i], i * p * (p + 1) / 2);
        }
      }
  });
}

TEST(Collectives, SendRecvAroundARing) {
  for_each_group([](const Group& g) {
    const ExecSpace exec;
    const int p = g.size();
    if (p == 1)
      return;
    const int next = (g.rank() + 1) % p;
    const int prev = (g.rank() + p - 1) % p;
    for (std::size_t n : kLengths) {
      auto out = filled<float>(n, [&](std::size_t i) { return 100.0f * g.rank() + i; });
      View1<float> in("in", n);
      // Even ranks send first, odd ranks receive first: no cycle of waiting senders.
      if (g.rank() % 2 == 0) {
        g.send(exec, out, next, 3);
        g.recv(exec, in, prev, 3);
      } else {
        g.recv(exec, in, prev, 3);
        g.send(exec, out, next, 3);
      }
      const auto h = to_host(in);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(h[i], 100.0f * prev + i);
    }
    g.barrier();
  });
}

TEST(Collectives, CountersFollowTheCostModel) {
  const int p = world_size();
  auto counters = std::make_shared<TrafficCounters>();
  const Group g("probe", Communicator::world(), counters);
  const ExecSpace exec;
  const std::size_t n = 13; // odd on purpose
  const double B = n * sizeof(float);

  View1<float> v("v", n), big("big", n * p);
  g.all_reduce(exec, v);
  g.all_reduce(exec, v);
  EXPECT_EQ(counters->calls("probe", Kind::all_reduce), 2u);
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::all_reduce), 2 * (2.0 * (p - 1) * B / p));

  g.all_gather(exec, v, big);
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::all_gather), (p - 1) * B);
  g.reduce_scatter(exec, big, v);
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::reduce_scatter), (p - 1) * B);
  g.broadcast(exec, v, 0);
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::broadcast), (p - 1) * B / p);
  View1<float> out("out", n);
  g.reduce(exec, v, out, 0);
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::reduce), (p - 1) * B / p);
  if (p > 1) {
    if (g.rank() == 0)
      g.send(exec, v, 1);
    if (g.rank() == 1)
      g.recv(exec, v, 0);
    EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::send), g.rank() == 0 ? B : 0.0);
    EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::recv), 0.0);
    EXPECT_EQ(counters->calls("probe", Kind::recv), g.rank() == 1 ? 1u : 0u);
  }
  const double expected_total = 2 * (2.0 * (p - 1) * B / p) + 2 * (p - 1) * B +
                                2 * (p - 1) * B / p + (p > 1 && g.rank() == 0 ? B : 0.0);
  EXPECT_DOUBLE_EQ(counters->total_bytes(), expected_total);
  EXPECT_DOUBLE_EQ(counters->bytes("probe"), expected_total);
  EXPECT_DOUBLE_EQ(counters->bytes("other", Kind::all_reduce), 0.0);

  // Zero-length messages are calls that send nothing.
  View1<float> empty("empty", 0), empty_big("empty_big", 0);
  counters->reset();
  g.all_reduce(exec, empty);
  g.all_gather(exec, empty, empty_big);
  EXPECT_EQ(counters->calls("probe", Kind::all_reduce), 1u);
  EXPECT_DOUBLE_EQ(counters->total_bytes(), 0.0);
}

TEST(Collectives, GridGroupsShareOneSetOfCounters) {
  const int n = world_size();
  ProcessGrid grid(Layout{1, 1, n, TensorMode::d1}, Communicator::world());
  const ExecSpace exec;
  View1<double> v("v", 10);
  grid.tp().all_reduce(exec, v);
  grid.dp().all_reduce(exec, v);
  EXPECT_DOUBLE_EQ(grid.traffic().bytes("tp", Kind::all_reduce), 2.0 * (n - 1) * 80.0 / n);
  EXPECT_DOUBLE_EQ(grid.traffic().bytes("dp", Kind::all_reduce), 0.0); // dp has one rank
  EXPECT_EQ(grid.traffic().calls("dp", Kind::all_reduce), 1u);
  const auto rows = grid.traffic().entries();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].group, "dp");
  EXPECT_EQ(rows[1].group, "tp");
}

TEST(Collectives, MisuseIsRefusedBeforeAnyCommunication) {
  const int p = world_size();
  auto counters = std::make_shared<TrafficCounters>();
  const Group g("probe", Communicator::world(), counters);
  const ExecSpace exec;
  View1<float> send("send", 4), wrong("wrong", 4 * p + 1);
  EXPECT_THROW(g.all_gather(exec, send, wrong), InternalError);
  EXPECT_THROW(g.reduce_scatter(exec, wrong, send), InternalError);
  EXPECT_THROW(g.broadcast(exec, send, p), InternalError);
  EXPECT_THROW(g.send(exec, send, -1), InternalError);
  auto strided = Kokkos::subview(View2<float>("m", 4, 4), Kokkos::ALL(), 1);
  EXPECT_THROW(g.all_reduce(exec, strided), InternalError);
  EXPECT_DOUBLE_EQ(counters->total_bytes(), 0.0);
  g.barrier(); // everyone is still in step
}
