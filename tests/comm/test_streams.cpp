// What the CPU build can check of the streams machinery: the pool the NCCL
// backend takes its CUDA events from (src/comm/handle_pool.hpp), batches of
// point-to-point transfers (comm/batch.hpp) through MPI with both matchings, and
// Request::wait_on for operations that are not on a GPU stream. The NCCL paths
// themselves (communication stream, events, group calls) only compile here.

#include "cubelm/comm/batch.hpp"
#include "cubelm/comm/grid.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/types.hpp"

#include "handle_pool.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::comm;

namespace {

Group world_group(std::shared_ptr<TrafficCounters> counters = std::make_shared<TrafficCounters>()) {
  return Group("probe", Communicator::world(), std::move(counters));
}

template <class V>
std::vector<typename V::non_const_value_type> values(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return {h.data(), h.data() + h.span()};
}

// A View of `n` elements (of the default memory space) holding f(i).
template <class F>
View1<float> filled(const std::string& label, std::size_t n, F f) {
  View1<float> v(label, n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < n; ++i)
    h(i) = f(i);
  Kokkos::deep_copy(v, h);
  return v;
}

} // namespace

// Handles are created only when none is spare, reused last-in first-out, and
// destroyed once, when the pool goes: a steady state of acquire/release creates
// nothing, and never more than the most ever out at once.
TEST(HandlePool, ReusesHandlesAndDestroysEachOnce) {
  int next = 100;
  std::vector<int> destroyed;
  {
    auto pool = std::make_shared<comm::detail::HandlePool<int>>(
        [&] { return next++; }, [&](int h) { destroyed.push_back(h); });
    const int a = pool->acquire(), b = pool->acquire();
    EXPECT_EQ(a, 100);
    EXPECT_EQ(b, 101);
    pool->release(a);
    EXPECT_EQ(pool->acquire(), a) << "a spare handle before a new one";
    pool->release(b);
    pool->release(a);
    for (int step = 0; step < 1000; ++step) { // steady state: two out at a time
      comm::detail::Pooled<int> x(pool), y(pool);
      EXPECT_NE(x.get(), y.get());
      EXPECT_TRUE(x.get() == a || x.get() == b);
    }
    EXPECT_EQ(pool->created(), 2u);
    EXPECT_EQ(pool->spare(), 2u);
    {
      std::vector<std::unique_ptr<comm::detail::Pooled<int>>> many;
      for (int i = 0; i < 5; ++i)
        many.push_back(std::make_unique<comm::detail::Pooled<int>>(pool));
      EXPECT_EQ(pool->created(), 5u) << "grows to the most out at once";
      EXPECT_EQ(pool->spare(), 0u);
    }
    EXPECT_EQ(pool->spare(), 5u);
    EXPECT_TRUE(destroyed.empty()) << "nothing is destroyed while the pool lives";
    // A Pooled keeps its pool alive after every other holder has let go.
    auto last = std::make_unique<comm::detail::Pooled<int>>(pool);
    pool.reset();
    EXPECT_TRUE(destroyed.empty());
    last.reset();
  }
  EXPECT_EQ(std::set<int>(destroyed.begin(), destroyed.end()),
            (std::set<int>{100, 101, 102, 103, 104}));
  EXPECT_EQ(destroyed.size(), 5u) << "each handle destroyed once";
}

// Both directions of a ring in one batch, several messages per neighbour, in both
// matchings; with lengths past MPI's eager limit, separate blocking calls would
// deadlock.
TEST(Batch, RingInBothDirectionsInOneBatch) {
  const Group g = world_group();
  const ExecSpace exec;
  const int p = g.size(), me = g.rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  for (const Matching matching : {Matching::in_order, Matching::by_tag})
    for (const std::size_t n : {std::size_t(0), std::size_t(5), std::size_t(1) << 16}) {
      SCOPED_TRACE(std::string(matching == Matching::in_order ? "in order" : "by tag") +
                   " n=" + std::to_string(n));
      std::vector<View1<float>> out, in;
      Batch batch(g, matching);
      for (int k = 0; k < 3; ++k) {
        out.push_back(
            filled("out", n, [&](std::size_t i) { return 1000.f * me + 10.f * k + i % 7; }));
        out.push_back(filled("back", n, [&](std::size_t i) { return -1000.f * me - k - i % 5; }));
        in.push_back(View1<float>("in", n));
        in.push_back(View1<float>("in_back", n));
        batch.send(out[2 * k], next, 2 * k);
        batch.send(out[2 * k + 1], prev, 2 * k + 1);
        batch.recv(in[2 * k], prev, 2 * k);
        batch.recv(in[2 * k + 1], next, 2 * k + 1);
      }
      EXPECT_EQ(batch.size(), 12u);
      std::vector<Request> done = batch.post(exec);
      EXPECT_EQ(batch.size(), 0u);
      ASSERT_EQ(done.size(), 12u);
      while (!test_all(done)) {
      }
      for (int k = 0; k < 3; ++k) {
        const auto a = values(in[2 * k]), b = values(in[2 * k + 1]);
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(a[i], 1000.f * prev + 10.f * k + i % 7);
          ASSERT_EQ(b[i], -1000.f * next - k - i % 5);
        }
      }
    }
}

// The two matchings differ where it shows: a rank sends A then B to its neighbour,
// which posts the receive for B's tag first. By tag the receives get B and A; in
// order (as NCCL matches, tags unused) the first receive posted gets A. One batch
// per rank, so that NCCL (a GPU build) can run it too.
TEST(Batch, MatchingInOrderIgnoresTags) {
  const Group g = world_group();
  const ExecSpace exec;
  const int p = g.size(), me = g.rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  for (const Matching matching : {Matching::by_tag, Matching::in_order}) {
    const View1<float> a = filled("a", 4, [&](std::size_t) { return 1.f + me; });
    const View1<float> b = filled("b", 4, [&](std::size_t) { return -1.f - me; });
    View1<float> first("first", 4), second("second", 4);
    Batch batch(g, matching);
    batch.send(a, next, 1);
    batch.send(b, next, 2);
    batch.recv(first, prev, 2);
    batch.recv(second, prev, 1);
    std::vector<Request> q = batch.post(exec);
    wait_all(q);
    const float from_a = 1.f + prev, from_b = -1.f - prev;
    if (matching == Matching::by_tag) {
      EXPECT_EQ(values(first), std::vector<float>(4, from_b));
      EXPECT_EQ(values(second), std::vector<float>(4, from_a));
    } else {
      EXPECT_EQ(values(first), std::vector<float>(4, from_a));
      EXPECT_EQ(values(second), std::vector<float>(4, from_b));
    }
  }
}

// Posting counts every transfer as isend and irecv do (Kind::send with its bytes,
// Kind::recv with none); misuse is refused when the transfer is added, before
// anything is sent or counted.
TEST(Batch, CountsLikeIsendAndIrecvAndRefusesMisuse) {
  const int p = Communicator::world().size();
  auto ours = std::make_shared<TrafficCounters>();
  auto theirs = std::make_shared<TrafficCounters>();
  const Group gb = world_group(ours), gi = world_group(theirs);
  const HostExecSpace exec;
  const int next = (gb.rank() + 1) % p, prev = (gb.rank() + p - 1) % p;
  HostView1<double> v("v", 13), w("w", 13), x("x", 13), y("y", 13);
  {
    Batch batch(gb, Matching::in_order);
    batch.send(v, next);
    batch.recv(w, prev);
    EXPECT_DOUBLE_EQ(ours->total_bytes(), 0.0) << "counted when posted";
    std::vector<Request> q = batch.post(exec);
    wait_all(q);
  }
  {
    Request r = gi.irecv(exec, x, prev);
    Request s = gi.isend(exec, y, next);
    r.wait();
    s.wait();
  }
  const auto want = theirs->entries(), got = ours->entries();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].kind, want[i].kind);
    EXPECT_EQ(got[i].calls, want[i].calls);
    EXPECT_DOUBLE_EQ(got[i].bytes, want[i].bytes);
  }
  EXPECT_DOUBLE_EQ(ours->bytes("probe", Kind::send), 13.0 * 8);

  auto counters = std::make_shared<TrafficCounters>();
  const Group g = world_group(counters);
  Batch bad(g, Matching::in_order);
  EXPECT_THROW(bad.send(v, p), InternalError);
  EXPECT_THROW(bad.recv(w, -1), InternalError);
  auto strided = Kokkos::subview(HostView2<float>("m", 4, 4), Kokkos::ALL(), 1);
  EXPECT_THROW(bad.send(strided, next), InternalError);
  EXPECT_EQ(bad.size(), 0u);
  EXPECT_TRUE(bad.post(exec).empty());
  EXPECT_DOUBLE_EQ(counters->total_bytes(), 0.0);
  g.barrier();
}

// Off a GPU stream (MPI, host memory, a host execution space) wait_on completes the
// operation on the host, as wait() does: the result is in place and the Request done.
TEST(Streams, WaitOnCompletesOperationsThatAreNotOnAStream) {
  const Group g = world_group();
  const int p = g.size();
  const ExecSpace exec;
  View1<float> v =
      filled("v", 100, [&](std::size_t i) { return static_cast<float>(g.rank() + i); });
  Request r = g.iall_reduce(exec, v);
  r.wait_on(exec);
  EXPECT_TRUE(r.done() || compat::stream_ordered<ExecSpace>::value);
  const auto s = values(v);
  for (std::size_t i = 0; i < s.size(); ++i)
    ASSERT_EQ(s[i], static_cast<float>(p * (p - 1) / 2 + p * static_cast<int>(i)));
  r.wait();
  EXPECT_TRUE(r.done());

  HostView1<double> h("h", 3);
  Kokkos::deep_copy(h, 1.0);
  Request q = g.iall_reduce(HostExecSpace(), h);
  q.wait_on(HostExecSpace());
  EXPECT_TRUE(q.done());
  EXPECT_EQ(h(2), static_cast<double>(p));
  Request none;
  none.wait_on(exec); // a complete Request: nothing to do
  EXPECT_TRUE(none.done());
}
