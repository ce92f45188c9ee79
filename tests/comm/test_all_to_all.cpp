// all_to_all and all_to_all_v against an independent formula: every element
// encodes (sender, receiver, index), so each rank can say what it must receive
// without asking anyone. On the world group and on every sub-grid group the job
// size allows; equal and uneven blocks (zeros, a rank that sends nothing, a rank
// that receives nothing); blocking and non-blocking; the traffic counters; and
// the errors for sizes and counts that do not fit.

#include "cubelm/comm/grid.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/types.hpp"

#include "test_helpers.hpp"
#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

using namespace cubelm;
using namespace cubelm::comm;

namespace {

int world_size() {
  return Communicator::world().size();
}

// Runs `check` on the world group and on every sub-grid group of one layout per
// tensor mode that fits this job (the same groups as the other collective tests).
void for_each_group(const std::function<void(const Group&, const ProcessGrid&)>& check) {
  const int n = world_size();
  const Communicator world = Communicator::world();
  {
    const ProcessGrid grid(Layout{1, 1, n, TensorMode::d1}, world);
    SCOPED_TRACE("world");
    check(grid.world(), grid);
    check(grid.tp(), grid);
  }
  if (n % 2 == 0) {
    const ProcessGrid grid(Layout{2, n / 2, 1, TensorMode::none}, world);
    SCOPED_TRACE("dp and pp");
    check(grid.dp(), grid);
    check(grid.pp(), grid);
  }
  if (n % 4 == 0) {
    const ProcessGrid grid(Layout{n / 4, 1, 4, TensorMode::d2}, world);
    SCOPED_TRACE("2d row/col");
    check(grid.tp_row(), grid);
    check(grid.tp_col(), grid);
  }
  if (n % 8 == 0) {
    const ProcessGrid grid(Layout{n / 8, 1, 8, TensorMode::d3}, world);
    SCOPED_TRACE("3d axes and planes");
    for (Axis a : {Axis::a, Axis::b, Axis::c})
      check(grid.tp_axis(a), grid);
    for (Plane p : {Plane::ab, Plane::bc, Plane::ca})
      check(grid.tp_plane(p), grid);
  }
}

// Element `index` of the block that group rank `from` sends to group rank `to`
// (exact in float: below 2^24).
template <class T>
T encode(int from, int to, std::size_t index) {
  return static_cast<T>(10000 * from + 100 * to + static_cast<int>(index % 100));
}

template <class T, class M>
using Flat = Kokkos::View<T*, Kokkos::LayoutRight, M>;

template <class T, class M>
Flat<T, M> filled(std::size_t n, const std::function<T(std::size_t)>& f) {
  return cubelm::testing::filled_in<T, M>(n, f);
}

using cubelm::testing::values;

// Equal blocks of n elements: send block j for rank j, then check every block
// received; all_to_all and iall_to_all (two in flight, completed in reverse).
template <class T, class Exec, class M>
void equal_blocks(const Group& g) {
  const Exec exec;
  const int p = g.size();
  const int me = g.rank();
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(33)}) {
    SCOPED_TRACE(g.name() + " block=" + std::to_string(n));
    const std::size_t total = n * static_cast<std::size_t>(p);
    auto send = filled<T, M>(
        total, [&](std::size_t j) { return encode<T>(me, static_cast<int>(j / n), j % n); });
    Flat<T, M> recv("recv", total), a("a", total), b("b", total);
    g.all_to_all(exec, send, recv);
    const auto got = values(recv);
    for (int from = 0; from < p; ++from)
      for (std::size_t k = 0; k < n; ++k)
        ASSERT_EQ(got[from * n + k], encode<T>(from, me, k)) << "from " << from << " k " << k;

    Request ra = g.iall_to_all(exec, send, a);
    Request rb = g.iall_to_all(exec, send, b);
    EXPECT_EQ(ra.active(), p > 1) << "a one-rank group completes at once";
    rb.wait();
    ra.wait();
    ASSERT_EQ(values(a), got);
    ASSERT_EQ(values(b), got);
  }
}

// How many elements group rank `from` sends to group rank `to` in `step` of the
// uneven exchanges: 0 to 4, often 0; rank 1 sends nothing, and on groups of 3 or
// more ranks rank 2 receives nothing.
std::size_t uneven_count(int from, int to, int p, int step) {
  if (from == 1 || (p >= 3 && to == 2))
    return 0;
  return static_cast<std::size_t>((3 * from + 5 * to + 7 * step) % 5);
}

std::vector<std::size_t> send_counts_of(int me, int p, int step) {
  std::vector<std::size_t> c(p);
  for (int to = 0; to < p; ++to)
    c[to] = uneven_count(me, to, p, step);
  return c;
}

std::vector<std::size_t> recv_counts_of(int me, int p, int step) {
  std::vector<std::size_t> c(p);
  for (int from = 0; from < p; ++from)
    c[from] = uneven_count(from, me, p, step);
  return c;
}

std::size_t sum(const std::vector<std::size_t>& c) {
  return std::accumulate(c.begin(), c.end(), std::size_t(0));
}

// Uneven blocks over several steps (the counts change every step, as a router's
// do), with Views longer than the blocks: the tail of recv must stay as it was.
// Blocking and non-blocking give the same; the counters add the bytes sent to the
// other ranks.
template <class T, class Exec, class M>
void uneven_blocks(const Group& g, const TrafficCounters& traffic) {
  const Exec exec;
  const int p = g.size();
  const int me = g.rank();
  const T untouched = static_cast<T>(-1);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(g.name() + " step " + std::to_string(step));
    const auto sc = send_counts_of(me, p, step);
    const auto rc = recv_counts_of(me, p, step);
    const std::size_t slack = 3;
    std::vector<T> out;
    for (int to = 0; to < p; ++to)
      for (std::size_t k = 0; k < sc[to]; ++k)
        out.push_back(encode<T>(me, to, k));
    out.resize(out.size() + slack, static_cast<T>(-2)); // past the blocks: never sent
    auto send = filled<T, M>(out.size(), [&](std::size_t i) { return out[i]; });
    auto fill = [&](std::size_t) { return untouched; };
    auto recv = filled<T, M>(sum(rc) + slack, fill);
    auto again = filled<T, M>(sum(rc) + slack, fill);

    const double bytes_before = traffic.bytes(g.name(), Kind::all_to_all);
    const auto calls_before = traffic.calls(g.name(), Kind::all_to_all);
    g.all_to_all_v(exec, send, sc, recv, rc);
    const double to_others = static_cast<double>((sum(sc) - sc[me]) * sizeof(T));
    EXPECT_DOUBLE_EQ(traffic.bytes(g.name(), Kind::all_to_all) - bytes_before, to_others);
    EXPECT_EQ(traffic.calls(g.name(), Kind::all_to_all) - calls_before, 1u);

    const auto got = values(recv);
    std::size_t at = 0;
    for (int from = 0; from < p; ++from)
      for (std::size_t k = 0; k < rc[from]; ++k, ++at)
        ASSERT_EQ(got[at], encode<T>(from, me, k)) << "from " << from << " k " << k;
    for (; at < got.size(); ++at)
      ASSERT_EQ(got[at], untouched) << "recv past the received blocks was written at " << at;

    {
      // The count vectors may go away once the call is posted.
      std::vector<std::size_t> sc2 = sc, rc2 = rc;
      Request r = g.iall_to_all_v(exec, send, sc2, again, rc2);
      sc2.assign(p, 99);
      rc2.clear();
      r.wait();
    }
    ASSERT_EQ(values(again), got);
    EXPECT_DOUBLE_EQ(traffic.bytes(g.name(), Kind::all_to_all) - bytes_before, 2 * to_others);
  }
}

// Runs `F<T, Exec, M>::run` on host Views, and on the default memory space when that differs.
template <template <class, class, class> class F, class T, class... A>
void on_host_and_default(const A&... args) {
  F<T, HostExecSpace, Kokkos::HostSpace>::run(args...);
  if constexpr (!std::is_same_v<MemSpace, Kokkos::HostSpace>)
    F<T, ExecSpace, MemSpace>::run(args...);
}
template <class T, class E, class M>
struct Equal {
  static void run(const Group& g) { equal_blocks<T, E, M>(g); }
};
template <class T, class E, class M>
struct Uneven {
  static void run(const Group& g, const TrafficCounters& t) { uneven_blocks<T, E, M>(g, t); }
};

// The message of the InternalError that `f` throws ("" and a failure otherwise).
std::string refusal(const std::function<void()>& f) {
  return cubelm::testing::internal_error_of(f);
}

} // namespace

TEST(AllToAll, EqualBlocksGoToTheirRanks) {
  for_each_group([](const Group& g, const ProcessGrid&) {
    on_host_and_default<Equal, float>(g);
    on_host_and_default<Equal, double>(g);
    on_host_and_default<Equal, std::int32_t>(g);
    on_host_and_default<Equal, std::int64_t>(g);
  });
}

TEST(AllToAll, UnevenBlocksWithZerosAndEmptyRanks) {
  for_each_group([](const Group& g, const ProcessGrid& grid) {
    on_host_and_default<Uneven, float>(g, grid.traffic());
    on_host_and_default<Uneven, double>(g, grid.traffic());
    on_host_and_default<Uneven, std::int64_t>(g, grid.traffic());
  });
}

TEST(AllToAll, EveryRankSendsNothing) {
  const Group g("probe", Communicator::world(), std::make_shared<TrafficCounters>());
  const HostExecSpace exec;
  const std::vector<std::size_t> none(g.size(), 0);
  HostView1<float> send("send", 0), recv("recv", 2);
  Kokkos::deep_copy(recv, 5.0f);
  g.all_to_all_v(exec, send, none, recv, none);
  g.iall_to_all_v(exec, send, none, recv, none).wait();
  EXPECT_EQ(recv(0), 5.0f);
  EXPECT_EQ(recv(1), 5.0f);
  EXPECT_EQ(g.traffic().calls("probe", Kind::all_to_all), 2u);
  EXPECT_DOUBLE_EQ(g.traffic().total_bytes(), 0.0);
}

TEST(AllToAll, CountersFollowTheCostModel) {
  const int p = world_size();
  auto counters = std::make_shared<TrafficCounters>();
  const Group g("probe", Communicator::world(), counters);
  const HostExecSpace exec;
  const std::size_t n = 13; // odd on purpose
  HostView1<float> send("send", n * p), recv("recv", n * p);
  g.all_to_all(exec, send, recv);
  g.iall_to_all(exec, send, recv).wait();
  // p - 1 blocks leave the rank; its own block stays.
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::all_to_all), 2.0 * (p - 1) * n * 4);
  EXPECT_EQ(counters->calls("probe", Kind::all_to_all), 2u);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::all_to_all, p, 52.0), 52.0);
  EXPECT_STREQ(kind_name(Kind::all_to_all), "all_to_all");

  // Uneven: rank r sends r + 1 + j doubles to rank j.
  counters->reset();
  std::vector<std::size_t> sc(p), rc(p);
  for (int j = 0; j < p; ++j) {
    sc[j] = static_cast<std::size_t>(g.rank() + 1 + j);
    rc[j] = static_cast<std::size_t>(j + 1 + g.rank());
  }
  HostView1<double> vs("vs", sum(sc)), vr("vr", sum(rc));
  g.all_to_all_v(exec, vs, sc, vr, rc);
  double expected = 0;
  for (int j = 0; j < p; ++j)
    if (j != g.rank())
      expected += 8.0 * (g.rank() + 1 + j);
  EXPECT_DOUBLE_EQ(counters->bytes("probe", Kind::all_to_all), expected);
  EXPECT_DOUBLE_EQ(counters->total_bytes(), expected);
  const auto rows = counters->entries();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].group + "." + kind_name(rows[0].kind), "probe.all_to_all");
  EXPECT_EQ(rows[0].calls, 1u);
}

TEST(AllToAll, OneRankGroupsCopyTheirOwnBlock) {
  auto counters = std::make_shared<TrafficCounters>();
  const Group self("self", Communicator::duplicate(MPI_COMM_SELF), counters);
  const HostExecSpace exec;
  HostView1<double> send("send", 5), recv("recv", 6);
  for (int i = 0; i < 5; ++i)
    send(i) = 1.5 * i;
  Kokkos::deep_copy(recv, -1.0);
  EXPECT_TRUE(self.iall_to_all_v(exec, send, {3}, recv, {3}).done());
  EXPECT_EQ(recv(2), 3.0);
  EXPECT_EQ(recv(3), -1.0);
  HostView1<double> whole("whole", 5);
  EXPECT_TRUE(self.iall_to_all(exec, send, whole).done());
  EXPECT_EQ(whole(4), 6.0);
  EXPECT_EQ(counters->calls("self", Kind::all_to_all), 2u);
  EXPECT_DOUBLE_EQ(counters->total_bytes(), 0.0);
}

TEST(AllToAll, BadSizesAndCountsAreRefusedBeforeAnyCommunication) {
  const int p = world_size();
  const int me = Communicator::world().rank();
  auto counters = std::make_shared<TrafficCounters>();
  const Group g("probe", Communicator::world(), counters);
  const HostExecSpace exec;
  const auto P = std::to_string(p);
  auto has = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  };

  HostView1<float> send("send", 4 * p), odd("odd", 4 * p + 1), short_recv("short", 4 * p - 1);
  if (p > 1)
    has(refusal([&] { g.all_to_all(exec, odd, send); }),
        "group 'probe' all_to_all: send has " + std::to_string(4 * p + 1) +
            " elements, not a multiple of the group size " + P);
  has(refusal([&] { g.all_to_all(exec, send, short_recv); }),
      "group 'probe' all_to_all: recv has " + std::to_string(4 * p - 1) + " elements, expected " +
          std::to_string(4 * p));
  has(refusal([&] { (void)g.iall_to_all(exec, send, short_recv); }),
      "group 'probe' iall_to_all: recv has");

  const std::vector<std::size_t> ones(p, 1), too_many(p + 1, 0), bigger(p, 5);
  HostView1<float> recv("recv", 4 * p);
  has(refusal([&] { g.all_to_all_v(exec, send, too_many, recv, ones); }),
      "group 'probe' all_to_all_v: send_counts has " + std::to_string(p + 1) +
          " entries, expected one per rank of the group (" + P + ")");
  has(refusal([&] { g.all_to_all_v(exec, send, ones, recv, {}); }),
      "all_to_all_v: recv_counts has 0 entries, expected one per rank of the group (" + P + ")");
  has(refusal([&] { g.all_to_all_v(exec, send, bigger, recv, ones); }),
      "all_to_all_v: send_counts add up to " + std::to_string(5 * p) + " elements, more than the " +
          std::to_string(4 * p) + " of send");
  has(refusal([&] { (void)g.iall_to_all_v(exec, send, ones, recv, bigger); }),
      "group 'probe' iall_to_all_v: recv_counts add up to " + std::to_string(5 * p) +
          " elements, more than the " + std::to_string(4 * p) + " of recv");
  std::vector<std::size_t> self_differs = ones;
  self_differs[me] = 2;
  has(refusal([&] { g.all_to_all_v(exec, send, self_differs, recv, ones); }),
      "all_to_all_v: rank " + std::to_string(me) + " sends itself 2 elements (send_counts[" +
          std::to_string(me) + "]) but receives 1 (recv_counts[" + std::to_string(me) + "])");
  HostView2<float> m("m", 4, 4 * p);
  auto strided = Kokkos::subview(m, Kokkos::ALL(), 1);
  has(refusal([&] { g.all_to_all(exec, strided, recv); }), "is not contiguous");
  has(refusal(
          [&] { g.all_to_all_v(exec, send, ones, Kokkos::subview(send, std::pair(0, 2)), ones); }),
      "send and recv overlap");

  EXPECT_DOUBLE_EQ(counters->total_bytes(), 0.0);
  EXPECT_EQ(counters->calls("probe", Kind::all_to_all), 0u);
  g.barrier(); // everyone is still in step
}
