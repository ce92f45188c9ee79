// Collectives on Kokkos Views against closed forms, on the world and on every
// sub-grid group the job size allows; odd and zero lengths; the traffic counters;
// the non-blocking operations against their blocking twins.

#include "cubelm/comm/grid.hpp"
#include "cubelm/core/bf16.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/types.hpp"

#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

using namespace cubelm;
using namespace cubelm::comm;

namespace {

const std::size_t kLengths[] = {0, 1, 7, 13, 1000};

int world_size() {
  return Communicator::world().size();
}

using cubelm::testing::filled;
using cubelm::testing::to_host;

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

// bfloat16 travels as two bytes and is reduced in float, each result rounded to the
// nearest bfloat16: sums of powers of two times small integers are exact at every
// partial sum whatever the order, and in a group of two a tie rounds to even.
TEST(Collectives, Bf16MovesTwoBytesAndReducesInFloat) {
  const auto from = [](float x) { return bf16::from(x); };
  for_each_group([&](const Group& g) {
    const ExecSpace exec;
    const int p = g.size();
    const int r = g.rank();
    for (std::size_t n : kLengths) {
      const auto scale = [](std::size_t i) { return static_cast<float>(1 << (i % 5)); };
      auto v = filled<bf16>(n, [&](std::size_t i) { return from((r + 1) * scale(i)); });
      g.all_reduce(exec, v);
      auto mx = filled<bf16>(n, [&](std::size_t i) { return from(-scale(i) * r); });
      g.all_reduce(exec, mx, ReduceOp::max);
      auto mn = filled<bf16>(n, [&](std::size_t i) { return from(-scale(i) * r); });
      g.all_reduce(exec, mn, ReduceOp::min);
      const auto sum = to_host(v), hi = to_host(mx), lo = to_host(mn);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(sum[i].value(), scale(i) * p * (p + 1) / 2) << g.name() << " n=" << n;
        ASSERT_EQ(hi[i].value(), 0.0f) << g.name();
        ASSERT_EQ(lo[i].value(), -scale(i) * (p - 1)) << g.name();
      }
      // Bits, not values, are gathered: every pattern arrives as it was sent.
      auto send = filled<bf16>(n, [&](std::size_t i) {
        bf16 b;
        b.bits = static_cast<std::uint16_t>(7919 * (r * n + i) + 1);
        return b;
      });
      View1<bf16> all("all", n * p);
      g.all_gather(exec, send, all);
      const auto h = to_host(all);
      for (std::size_t j = 0; j < n * p; ++j)
        ASSERT_EQ(h[j].bits, static_cast<std::uint16_t>(7919 * j + 1)) << g.name();
    }
    if (p == 2) {
      // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even is 1. 1 + 3 x 2^-8 lies halfway
      // between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
      auto tie = filled<bf16>(
          2, [&](std::size_t i) { return from(r == 0 ? 1.0f : (i == 0 ? 1.0f : 3.0f) / 256); });
      g.all_reduce(exec, tie);
      const auto t = to_host(tie);
      EXPECT_EQ(t[0].value(), 1.0f) << g.name();
      EXPECT_EQ(t[1].value(), 1.0f + 1.0f / 64) << g.name();
    }
  });
  // The counters count two bytes an element.
  const int p = world_size();
  auto counters = std::make_shared<TrafficCounters>();
  const Group g("probe", Communicator::world(), counters);
  View1<bf16> v("v", 13);
  g.all_reduce(ExecSpace(), v);
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::all_reduce), 2.0 * (p - 1) * 13 * 2 / p);
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

// ---- Non-blocking operations ----------------------------------------------

namespace {

using cubelm::testing::filled_in;
using cubelm::testing::values;

// Every non-blocking collective against its blocking twin (and the closed
// forms of the tests above), with all three in flight at once and completed
// in reverse order, partly by polling test(). Values are small integers, so
// the sums are exact whatever order the library adds in.
template <class T, class Exec, class M>
void nonblocking_collectives_match(const Group& g) {
  const Exec exec;
  using V = Kokkos::View<T*, Kokkos::LayoutRight, M>;
  const int p = g.size();
  const T r = static_cast<T>(g.rank());
  for (std::size_t n : kLengths) {
    SCOPED_TRACE(g.name() + " n=" + std::to_string(n));
    auto sum_in = [&](std::size_t i) { return (r + 1) * static_cast<T>(i % 17 + 1); };
    auto gather_in = [&](std::size_t i) { return 1000 * r + static_cast<T>(i % 97); };
    V a = filled_in<T, M>(n, sum_in), b = filled_in<T, M>(n, sum_in);
    V mx = filled_in<T, M>(n, gather_in), my = filled_in<T, M>(n, gather_in);
    V gs = filled_in<T, M>(n, gather_in), ga("ga", n * p), gb("gb", n * p);
    V rs = filled_in<T, M>(n * p, sum_in), ra("ra", n), rb("rb", n);

    g.all_reduce(exec, a);
    g.all_reduce(exec, mx, ReduceOp::max);
    g.all_gather(exec, gs, ga);
    g.reduce_scatter(exec, rs, ra);

    std::vector<Request> in_flight;
    in_flight.push_back(g.iall_reduce(exec, b));
    in_flight.push_back(g.iall_reduce(exec, my, ReduceOp::max));
    in_flight.push_back(g.iall_gather(exec, gs, gb));
    in_flight.push_back(g.ireduce_scatter(exec, rs, rb));
    for (const Request& q : in_flight)
      EXPECT_EQ(q.active(), p > 1) << "a one-rank group completes at once";
    while (!in_flight[3].test()) {
    }
    EXPECT_TRUE(in_flight[3].done());
    for (auto it = in_flight.rbegin(); it != in_flight.rend(); ++it)
      it->wait();
    EXPECT_TRUE(test_all(in_flight));

    ASSERT_EQ(values(b), values(a));
    ASSERT_EQ(values(my), values(mx));
    ASSERT_EQ(values(gb), values(ga));
    ASSERT_EQ(values(rb), values(ra));
    const auto s = values(b);
    const T tri = static_cast<T>(p * (p + 1) / 2);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(s[i], static_cast<T>(i % 17 + 1) * tri);
  }
}

// Both directions of a ring posted before any wait, sends first: with blocking
// calls and messages past the eager limit this would deadlock. A one-rank
// group sends to itself.
template <class T, class Exec, class M>
void ring_both_directions(const Group& g) {
  const Exec exec;
  using V = Kokkos::View<T*, Kokkos::LayoutRight, M>;
  const int p = g.size();
  const int next = (g.rank() + 1) % p;
  const int prev = (g.rank() + p - 1) % p;
  const T me = static_cast<T>(g.rank());
  for (std::size_t n : {std::size_t(0), std::size_t(7), std::size_t(1) << 15}) {
    SCOPED_TRACE(g.name() + " n=" + std::to_string(n));
    V to_next = filled_in<T, M>(n, [&](std::size_t i) { return me + static_cast<T>(i % 251); });
    V to_prev = filled_in<T, M>(n, [&](std::size_t i) { return -me - static_cast<T>(i % 13); });
    V from_prev("from_prev", n), from_next("from_next", n);
    std::vector<Request> q;
    q.push_back(g.isend(exec, to_next, next, 1));
    q.push_back(g.isend(exec, to_prev, prev, 2));
    q.push_back(g.irecv(exec, from_prev, prev, 1));
    q.push_back(g.irecv(exec, from_next, next, 2));
    while (!test_all(q)) {
    }
    const auto a = values(from_prev);
    const auto b = values(from_next);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(a[i], static_cast<T>(prev) + static_cast<T>(i % 251));
      ASSERT_EQ(b[i], -static_cast<T>(next) - static_cast<T>(i % 13));
    }
  }
}

// Runs `f<T, Exec, M>` on host Views, and on the default memory space when that differs.
template <template <class, class, class> class F, class T>
void on_host_and_default(const Group& g) {
  F<T, HostExecSpace, Kokkos::HostSpace>::run(g);
  if constexpr (!std::is_same_v<MemSpace, Kokkos::HostSpace>)
    F<T, ExecSpace, MemSpace>::run(g);
}
template <class T, class E, class M>
struct MatchBlocking {
  static void run(const Group& g) { nonblocking_collectives_match<T, E, M>(g); }
};
template <class T, class E, class M>
struct Ring {
  static void run(const Group& g) { ring_both_directions<T, E, M>(g); }
};

} // namespace

TEST(NonBlocking, CollectivesMatchTheirBlockingTwins) {
  for_each_group([](const Group& g) {
    on_host_and_default<MatchBlocking, float>(g);
    on_host_and_default<MatchBlocking, double>(g);
  });
}

TEST(NonBlocking, RingOfSendsAndReceivesInBothDirections) {
  for_each_group([](const Group& g) {
    on_host_and_default<Ring, float>(g);
    on_host_and_default<Ring, double>(g);
    g.barrier();
  });
}

TEST(NonBlocking, TestTurnsTrueOnceThePartnerPosts) {
  const Group g("probe", Communicator::world(), std::make_shared<TrafficCounters>());
  const HostExecSpace exec;
  const int p = g.size();
  HostView1<double> in("in", 5), out("out", 5);
  Kokkos::deep_copy(out, 1.0 + g.rank());
  const int from = (g.rank() + p - 1) % p;
  Request r = g.irecv(exec, in, from, 9);
  EXPECT_TRUE(r.active());
  // Every rank sends only after the barrier, so nothing can have arrived yet.
  EXPECT_FALSE(r.test());
  g.barrier();
  Request s = g.isend(exec, out, (g.rank() + 1) % p, 9);
  while (!r.test()) {
  }
  EXPECT_TRUE(r.done());
  EXPECT_TRUE(r.test()); // again, harmlessly
  s.wait();
  EXPECT_TRUE(s.done());
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(in(i), 1.0 + from);
}

TEST(NonBlocking, DefaultMovedAndDroppedRequests) {
  Request none;
  EXPECT_TRUE(none.done());
  EXPECT_FALSE(none.active());
  EXPECT_TRUE(none.test());
  none.wait();

  const Group g("probe", Communicator::world(), std::make_shared<TrafficCounters>());
  const HostExecSpace exec;
  const int p = g.size();
  HostView1<float> a("a", 3), b("b", 3);
  Kokkos::deep_copy(a, static_cast<float>(g.rank()));
  Request moved = g.iall_reduce(exec, a);
  Request taken(std::move(moved));
  EXPECT_TRUE(moved.done()); // NOLINT(bugprone-use-after-move): a moved-from Request is empty
  EXPECT_EQ(taken.active(), p > 1);
  // Move assignment completes the operation it replaces before taking the new one.
  taken = g.iall_reduce(exec, b);
  EXPECT_EQ(a(0), static_cast<float>(p * (p - 1) / 2));
  taken.wait();

  // Dropped without wait: the destructors wait, and the data arrives.
  HostView1<float> in("in", 4), out("out", 4);
  Kokkos::deep_copy(out, 3.0f + g.rank());
  {
    Request r = g.irecv(exec, in, (g.rank() + p - 1) % p);
    Request s = g.isend(exec, out, (g.rank() + 1) % p);
  }
  EXPECT_EQ(in(3), 3.0f + (g.rank() + p - 1) % p);
}

TEST(NonBlocking, CountersEqualThoseOfTheBlockingCalls) {
  const int p = world_size();
  auto blocking = std::make_shared<TrafficCounters>();
  auto nonblocking = std::make_shared<TrafficCounters>();
  const Group gb("probe", Communicator::world(), blocking);
  const Group gn("probe", Communicator::world(), nonblocking);
  const HostExecSpace exec;
  const std::size_t n = 13;
  HostView1<double> v("v", n), big("big", n * p), empty("empty", 0);
  const int next = (gb.rank() + 1) % p, prev = (gb.rank() + p - 1) % p;

  gb.all_reduce(exec, v);
  gb.all_reduce(exec, empty);
  gb.all_gather(exec, v, big);
  gb.reduce_scatter(exec, big, v);
  if (p > 1) {
    if (gb.rank() % 2 == 0) {
      gb.send(exec, v, next);
      gb.recv(exec, v, prev);
    } else {
      gb.recv(exec, v, prev);
      gb.send(exec, v, next);
    }
  }

  std::vector<Request> q;
  q.push_back(gn.iall_reduce(exec, v));
  q.push_back(gn.iall_reduce(exec, empty));
  q.push_back(gn.iall_gather(exec, v, big));
  wait_all(q);
  gn.ireduce_scatter(exec, big, v).wait();
  if (p > 1) {
    HostView1<double> in("in", n);
    Request r = gn.irecv(exec, in, prev);
    gn.isend(exec, v, next).wait();
    r.wait();
  }

  const auto want = blocking->entries();
  const auto got = nonblocking->entries();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].kind, want[i].kind);
    EXPECT_EQ(got[i].calls, want[i].calls) << kind_name(want[i].kind);
    EXPECT_DOUBLE_EQ(got[i].bytes, want[i].bytes) << kind_name(want[i].kind);
  }
  EXPECT_DOUBLE_EQ(nonblocking->bytes("probe", Kind::all_reduce), 2.0 * (p - 1) * 8.0 * n / p);
  EXPECT_EQ(nonblocking->calls("probe", Kind::all_reduce), 2u);
}

TEST(NonBlocking, OneRankGroupsCompleteAtOnceAndCountLikeBlocking) {
  auto counters = std::make_shared<TrafficCounters>();
  const Group self("self", Communicator::duplicate(MPI_COMM_SELF), counters);
  const HostExecSpace exec;
  HostView1<double> v("v", 6), out("out", 6);
  Kokkos::deep_copy(v, 2.5);
  Request r = self.iall_reduce(exec, v);
  EXPECT_TRUE(r.done());
  Request g = self.iall_gather(exec, v, out);
  EXPECT_TRUE(g.done());
  EXPECT_EQ(out(5), 2.5);
  Kokkos::deep_copy(out, 0.0);
  EXPECT_TRUE(self.ireduce_scatter(exec, v, out).done());
  EXPECT_EQ(out(0), 2.5);
  EXPECT_EQ(counters->calls("self", Kind::all_reduce), 1u);
  EXPECT_EQ(counters->calls("self", Kind::all_gather), 1u);
  EXPECT_EQ(counters->calls("self", Kind::reduce_scatter), 1u);
  EXPECT_DOUBLE_EQ(counters->total_bytes(), 0.0);
}

TEST(NonBlocking, MisuseIsRefusedBeforeAnyCommunication) {
  const int p = world_size();
  auto counters = std::make_shared<TrafficCounters>();
  const Group g("probe", Communicator::world(), counters);
  const HostExecSpace exec;
  HostView1<float> send("send", 4), wrong("wrong", 4 * p + 1);
  EXPECT_THROW((void)g.iall_gather(exec, send, wrong), InternalError);
  EXPECT_THROW((void)g.ireduce_scatter(exec, wrong, send), InternalError);
  EXPECT_THROW((void)g.isend(exec, send, p), InternalError);
  EXPECT_THROW((void)g.irecv(exec, send, -1), InternalError);
  auto strided = Kokkos::subview(HostView2<float>("m", 4, 4), Kokkos::ALL(), 1);
  EXPECT_THROW((void)g.iall_reduce(exec, strided), InternalError);
  EXPECT_DOUBLE_EQ(counters->total_bytes(), 0.0);
  g.barrier();
}
