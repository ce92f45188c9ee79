// Ranks that share a GPU (docs/communication.md, "Ranks that share a GPU"): the pure
// decision over device keys and its one-line message; the group-level decision with
// device keys injected through CommOptions::devices, against member lists written out
// by hand for each pattern; the staged route's results for every kind of operation
// against closed forms, and its staging buffers reused (no allocation once warm).

#include "cubelm/comm/batch.hpp"
#include "cubelm/comm/devices.hpp"
#include "cubelm/comm/grid.hpp"
#include "cubelm/core/devices.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/peak.hpp"
#include "cubelm/core/placement.hpp"
#include "cubelm/core/types.hpp"

#include "view_helpers.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::comm;

namespace {

DeviceKey gpu(int node, int ordinal, const std::string& node_name = "") {
  DeviceKey k;
  k.node = node;
  k.node_name = node_name.empty() ? "n" + std::to_string(node) : node_name;
  k.ordinal = ordinal;
  k.device = "0000:" + std::to_string(10 + ordinal) + ":00.0"; // same bus ids on every node
  return k;
}

DeviceKey no_gpu(int node) {
  DeviceKey k;
  k.node = node;
  k.node_name = "n" + std::to_string(node);
  return k;
}

std::vector<std::vector<int>> collisions(const std::vector<DeviceKey>& ranks) {
  std::vector<std::vector<int>> out;
  for (const SharedDevice& s : shared_devices(ranks))
    out.push_back(s.ranks);
  return out;
}

using Sets = std::vector<std::vector<int>>;

int world_size() {
  return Communicator::world().size();
}

std::vector<int> all_ranks(int n) {
  std::vector<int> all;
  for (int r = 0; r < n; ++r)
    all.push_back(r);
  return all;
}

} // namespace

// ---- the pure decision -------------------------------------------------------------

TEST(SharedDevices, DistinctGpusShareNothing) {
  EXPECT_TRUE(collisions({gpu(0, 0), gpu(0, 1), gpu(0, 2), gpu(0, 3)}).empty());
  EXPECT_TRUE(collisions({gpu(0, 0)}).empty()); // one rank
  EXPECT_TRUE(collisions({}).empty());
}

TEST(SharedDevices, TwoRanksOnOneGpu) {
  EXPECT_EQ(collisions({gpu(0, 0), gpu(0, 0)}), (Sets{{0, 1}}));
  const std::vector<SharedDevice> s = shared_devices({gpu(0, 1, "gpu01"), gpu(0, 1, "gpu01")});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].node, 0);
  EXPECT_EQ(s[0].node_name, "gpu01");
  EXPECT_EQ(s[0].device, "0000:11:00.0");
  EXPECT_EQ(s[0].ordinal, 1);
}

TEST(SharedDevices, RanksModuloGpusOrderedByFirstRank) {
  // Node-local rank mod 2 GPUs: ranks 0 and 2 on GPU 0, 1 and 3 on GPU 1.
  EXPECT_EQ(collisions({gpu(0, 0), gpu(0, 1), gpu(0, 0), gpu(0, 1)}), (Sets{{0, 2}, {1, 3}}));
  // Three ranks on one GPU, the fourth alone.
  EXPECT_EQ(collisions({gpu(0, 1), gpu(0, 0), gpu(0, 1), gpu(0, 1)}), (Sets{{0, 2, 3}}));
}

TEST(SharedDevices, TheSameBusIdOnTwoNodesIsTwoGpus) {
  EXPECT_TRUE(collisions({gpu(0, 0), gpu(2, 0)}).empty());
  // Two nodes of two ranks with one GPU each; then two nodes with one GPU per rank.
  EXPECT_EQ(collisions({gpu(0, 0), gpu(0, 0), gpu(2, 0), gpu(2, 0)}), (Sets{{0, 1}, {2, 3}}));
  EXPECT_TRUE(collisions({gpu(0, 0), gpu(0, 1), gpu(2, 0), gpu(2, 1)}).empty());
  // Several nodes, one of them oversubscribed.
  EXPECT_EQ(collisions({gpu(0, 0), gpu(0, 1), gpu(2, 0), gpu(2, 1), gpu(4, 0), gpu(4, 0)}),
            (Sets{{4, 5}}));
}

TEST(SharedDevices, RanksWithoutAGpuShareNone) {
  EXPECT_TRUE(collisions({no_gpu(0), no_gpu(0), no_gpu(0)}).empty());
  EXPECT_EQ(collisions({no_gpu(0), gpu(0, 0), no_gpu(0), gpu(0, 0)}), (Sets{{1, 3}}));
}

TEST(SharedDevices, OneLineSaysWhichRanksShareWhichGpu) {
  EXPECT_EQ(describe_shared_devices({}, false), "");
  EXPECT_EQ(describe_shared_devices(shared_devices({gpu(0, 0, "X"), gpu(0, 0, "X")}), false),
            "cubelm: 2 ranks share a GPU on node X (ranks 0,1 on GPU 0): groups spanning them "
            "use MPI through host memory instead of NCCL");
  EXPECT_EQ(
      describe_shared_devices(
          shared_devices({gpu(0, 0, "X"), gpu(0, 1, "X"), gpu(0, 0, "X"), gpu(0, 1, "X")}), true),
      "cubelm: 2 ranks share each of 2 GPUs on node X (ranks 0,2 on GPU 0, ranks 1,3 on "
      "GPU 1): groups spanning them use GPU-aware MPI instead of NCCL");
  EXPECT_EQ(describe_shared_devices(shared_devices({gpu(0, 0, "a"), gpu(0, 0, "a"), gpu(2, 0, "b"),
                                                    gpu(2, 0, "b"), gpu(2, 0, "b")}),
                                    false),
            "cubelm: 2 to 3 ranks share each of 2 GPUs on 2 nodes (node a: ranks 0,1 on GPU 0; "
            "node b: ranks 2,3,4 on GPU 0): groups spanning them use MPI through host memory "
            "instead of NCCL");
  std::vector<DeviceKey> many;
  for (int r = 0; r < 12; ++r)
    many.push_back(gpu(0, r / 2, "big"));
  EXPECT_EQ(describe_shared_devices(shared_devices(many), false),
            "cubelm: 2 ranks share each of 6 GPUs on node big (ranks 0,1 on GPU 0, ranks 2,3 on "
            "GPU 1, ranks 4,5 on GPU 2, ranks 6,7 on GPU 3; 2 more): groups spanning them use "
            "MPI through host memory instead of NCCL");
}

// ---- the staging buffers -----------------------------------------------------------

TEST(StagingPool, LendsEachBufferToOneOperationAndReusesIt) {
  const comm::detail::StagingPool pool;
  const void* hundred = nullptr;
  const void* ten = nullptr;
  {
    const auto a = pool.acquire(100);
    const auto b = pool.acquire(10);
    EXPECT_NE(a.get(), b.get());
    hundred = a.get();
    ten = b.get();
  }
  EXPECT_EQ(pool.buffers(), 2u);
  {
    const auto c = pool.acquire(10); // a free buffer of that size
    const auto d = pool.acquire(100);
    EXPECT_EQ(c.get(), ten);
    EXPECT_EQ(d.get(), hundred);
    EXPECT_EQ(pool.buffers(), 2u);
    const auto e = pool.acquire(10); // both lent: one more
    EXPECT_NE(e.get(), ten);
    EXPECT_EQ(pool.buffers(), 3u);
    const auto copy = e; // lent until the last copy is gone
  }
  {
    const auto f = pool.acquire(50); // a new size, though larger buffers are free
    EXPECT_EQ(pool.buffers(), 4u);
  }
  // A pattern seen once (sizes and overlaps) allocates nothing the next times.
  const auto pattern = [&] {
    const auto x = pool.acquire(1000);
    { const auto y = pool.acquire(64); }
    const auto z = pool.acquire(10);
    const auto w = pool.acquire(10);
    const auto v = pool.acquire(64);
  };
  pattern();
  const std::size_t warm = pool.buffers();
  EXPECT_EQ(warm, 6u);
  for (int i = 0; i < 3; ++i)
    pattern();
  EXPECT_EQ(pool.buffers(), warm);
}

// ---- the decision of groups, with injected device keys ----------------------------

namespace {

// The members of each group of `grid` (world ranks), written out for the layouts used
// below: 1d tensor parallelism over tp ranks and data parallelism over the rest.
struct Expected {
  std::vector<int> tp, dp;
};

Expected members_1d(int world_rank, int tp, int world) {
  Expected e;
  const int t = world_rank % tp, d = world_rank / tp;
  for (int i = 0; i < tp; ++i)
    e.tp.push_back(d * tp + i);
  for (int i = 0; i < world / tp; ++i)
    e.dp.push_back(i * tp + t);
  return e;
}

// Whether any two of `ranks` have the same (node, bus id) in `devices`, decided here
// without shared_devices().
bool any_pair_shares(const std::vector<int>& ranks, const std::vector<DeviceKey>& devices) {
  for (std::size_t i = 0; i < ranks.size(); ++i)
    for (std::size_t j = i + 1; j < ranks.size(); ++j) {
      const DeviceKey& a = devices[static_cast<std::size_t>(ranks[i])];
      const DeviceKey& b = devices[static_cast<std::size_t>(ranks[j])];
      if (!a.device.empty() && a.node == b.node && a.device == b.device)
        return true;
    }
  return false;
}

Group::Route expected_route(bool shared, const CommOptions& o) {
#ifdef CUBELM_ENABLE_NCCL
  if (o.use_nccl && !shared)
    return Group::Route::nccl;
#else
  (void)shared;
#endif
  return o.gpu_aware_mpi ? Group::Route::gpu_aware_mpi : Group::Route::staged;
}

// Device patterns for a world of n ranks, by name.
std::map<std::string, std::vector<DeviceKey>> patterns(int n) {
  std::map<std::string, std::vector<DeviceKey>> p;
  for (int r = 0; r < n; ++r) {
    p["distinct"].push_back(gpu(0, r));
    p["one gpu"].push_back(gpu(0, 0));
    p["neighbours share"].push_back(gpu(0, r / 2));      // ranks 2k and 2k+1 on GPU k
    p["modulo two gpus"].push_back(gpu(0, r % 2));       // node-local rank mod 2 GPUs
    p["a node per pair"].push_back(gpu(2 * (r / 2), 0)); // one GPU per node, same bus id
    p["a node per rank"].push_back(gpu(r, 0));
    p["no gpus"].push_back(no_gpu(0));
  }
  return p;
}

} // namespace

TEST(SharedDevices, WorldGroupFollowsItsMembersGpus) {
  const int n = world_size();
  for (const auto& [name, devices] : patterns(n)) {
    SCOPED_TRACE(name);
    CommOptions o;
    o.devices = devices;
    const bool shared = any_pair_shares(all_ranks(n), devices);
    const Group g("world", Communicator::world(), std::make_shared<TrafficCounters>(), o);
    EXPECT_EQ(g.shares_device(), shared);
    EXPECT_EQ(g.device_collective_route(), expected_route(shared, o));
    o.use_nccl = false; // CUBELM_USE_NCCL=0: MPI for every group
    const Group off("world", Communicator::world(), std::make_shared<TrafficCounters>(), o);
    EXPECT_EQ(off.device_collective_route(), Group::Route::staged);
    o.use_nccl = true;
    o.gpu_aware_mpi = true;
    const Group aware("world", Communicator::world(), std::make_shared<TrafficCounters>(), o);
    EXPECT_EQ(aware.device_collective_route(), expected_route(shared, o));
  }
  // Hand-checked answers for the patterns that matter at 2 and 4 ranks.
  if (n == 2 || n == 4) {
    const auto p = patterns(n);
    EXPECT_FALSE(any_pair_shares({0, 1}, p.at("distinct")));
    EXPECT_TRUE(any_pair_shares({0, 1}, p.at("one gpu")));
    EXPECT_FALSE(any_pair_shares({0, 1}, p.at("a node per rank")));
    EXPECT_FALSE(any_pair_shares({0, 1}, p.at("no gpus")));
  }
}

TEST(SharedDevices, OnlyGroupsSpanningASharedGpuLeaveNccl) {
  const int n = world_size();
  if (n % 2 != 0)
    GTEST_SKIP() << "1d tensor parallelism over 2 ranks";
  const int rank = Communicator::world().rank();
  const Layout layout{n / 2, 1, 2, TensorMode::d1};
  const Expected members = members_1d(rank, 2, n);
  // At 4 ranks, by hand: tp = {0,1} or {2,3}, dp = {0,2} or {1,3}.
  if (n == 4) {
    EXPECT_EQ(members.tp, (rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    EXPECT_EQ(members.dp, (rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
  }
  const std::map<std::string, std::pair<bool, bool>> by_hand = {
      // at 4 ranks: tp, dp shared
      {"distinct", {false, false}},        {"one gpu", {true, true}},
      {"neighbours share", {true, false}}, {"modulo two gpus", {false, true}},
      {"a node per pair", {true, false}},  {"a node per rank", {false, false}},
      {"no gpus", {false, false}}};
  const Communicator world = Communicator::world();
  for (const auto& [name, devices] : patterns(n)) {
    SCOPED_TRACE(name);
    const bool tp_shared = any_pair_shares(members.tp, devices);
    const bool dp_shared = any_pair_shares(members.dp, devices);
    if (n == 4) {
      EXPECT_EQ(tp_shared, by_hand.at(name).first);
      EXPECT_EQ(dp_shared, by_hand.at(name).second);
    }
    CommOptions o;
    o.devices = devices;
    // The routes, NCCL allowed, on groups split as the grid splits them: building a
    // ProcessGrid would create the NCCL communicators of these made-up devices.
    const Group tp("tp", world.split(rank / 2, rank % 2), std::make_shared<TrafficCounters>(), o);
    const Group dp("dp", world.split(rank % 2, rank / 2), std::make_shared<TrafficCounters>(), o);
    EXPECT_EQ(tp.communicator().world_ranks(), members.tp);
    EXPECT_EQ(dp.communicator().world_ranks(), members.dp);
    EXPECT_EQ(tp.shares_device(), tp_shared);
    EXPECT_EQ(dp.shares_device(), dp_shared);
    EXPECT_EQ(tp.device_collective_route(), expected_route(tp_shared, o));
    EXPECT_EQ(dp.device_collective_route(), expected_route(dp_shared, o));
    // The grid passes the devices to every group; NCCL off, so that it connects nothing.
    o.use_nccl = false;
    const ProcessGrid grid(layout, world, o);
    EXPECT_EQ(grid.tp().shares_device(), tp_shared);
    EXPECT_EQ(grid.dp().shares_device(), dp_shared);
    EXPECT_EQ(grid.world().shares_device(), any_pair_shares(all_ranks(n), devices));
    EXPECT_FALSE(grid.pp().shares_device()); // one rank
    EXPECT_FALSE(grid.embedding().shares_device());
    for (const Group* g : {&grid.world(), &grid.tp(), &grid.dp(), &grid.pp()})
      EXPECT_EQ(g->device_collective_route(), Group::Route::staged);
  }
}

TEST(SharedDevices, InjectedDevicesMustListTheWorld) {
  CommOptions o;
  o.devices.assign(static_cast<std::size_t>(world_size()) + 1, gpu(0, 0));
  EXPECT_THROW(Group("world", Communicator::world(), std::make_shared<TrafficCounters>(), o),
               InternalError);
}

// ---- the staged route's results ---------------------------------------------------

namespace {

using cubelm::testing::filled;
using cubelm::testing::to_host;

int g_stage_allocations = 0;
void count_stage(Kokkos::Profiling::SpaceHandle, const char* label, const void*, std::uint64_t) {
  if (std::string(label) == "cubelm::comm::stage")
    ++g_stage_allocations;
}

// Every kind of operation on group `g`, its results against closed forms. Values are
// small integers in doubles: every sum is exact.
void run_every_operation(const Group& g) {
  const ExecSpace exec;
  const int p = g.size(), r = g.rank();
  const std::size_t n = 5;
  const auto value = [](int rank, std::size_t i) { return 100.0 * rank + static_cast<double>(i); };

  View1<double> a = filled<double>(n, [&](std::size_t i) { return value(r, i); });
  g.all_reduce(exec, a);
  View1<double> m = filled<double>(n, [&](std::size_t i) { return value(r, i); });
  g.all_reduce(exec, m, ReduceOp::max);
  Request ir;
  View1<double> ia = filled<double>(n, [&](std::size_t i) { return value(r, i); });
  ir = g.iall_reduce(exec, ia);
  ir.wait();
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(to_host(a)[i], 100.0 * p * (p - 1) / 2 + p * static_cast<double>(i));
    EXPECT_EQ(to_host(m)[i], value(p - 1, i));
    EXPECT_EQ(to_host(ia)[i], to_host(a)[i]);
  }

  View1<double> mine = filled<double>(n, [&](std::size_t i) { return value(r, i); });
  View1<double> all("all", n * static_cast<std::size_t>(p)), iall("iall", all.extent(0));
  g.all_gather(exec, mine, all);
  Request gr = g.iall_gather(exec, mine, iall);
  gr.wait();
  for (int k = 0; k < p; ++k)
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(to_host(all)[static_cast<std::size_t>(k) * n + i], value(k, i));
      EXPECT_EQ(to_host(iall)[static_cast<std::size_t>(k) * n + i], value(k, i));
    }

  const View1<double> blocks =
      filled<double>(n * static_cast<std::size_t>(p), [&](std::size_t i) { return r + 1.0 * i; });
  View1<double> scattered("scattered", n), iscattered("iscattered", n);
  g.reduce_scatter(exec, blocks, scattered);
  Request sr = g.ireduce_scatter(exec, blocks, iscattered);
  sr.wait();
  for (std::size_t i = 0; i < n; ++i) {
    const double at = static_cast<double>(static_cast<std::size_t>(r) * n + i);
    EXPECT_EQ(to_host(scattered)[i], p * (p - 1) / 2.0 + p * at);
    EXPECT_EQ(to_host(iscattered)[i], to_host(scattered)[i]);
  }

  // all_to_all: block j of rank r holds 10 r + j; all_to_all_v: r + 1 elements to rank j.
  const View1<double> out = filled<double>(2 * static_cast<std::size_t>(p),
                                           [&](std::size_t i) { return 10.0 * r + i / 2; });
  View1<double> in("in", out.extent(0));
  g.all_to_all(exec, out, in);
  for (int k = 0; k < p; ++k)
    EXPECT_EQ(to_host(in)[2 * static_cast<std::size_t>(k)], 10.0 * k + r);
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(p),
                                       static_cast<std::size_t>(r + 1));
  std::vector<std::size_t> recv_counts;
  std::size_t received = 0;
  for (int k = 0; k < p; ++k) {
    recv_counts.push_back(static_cast<std::size_t>(k + 1));
    received += static_cast<std::size_t>(k + 1);
  }
  const View1<double> vout = filled<double>(send_counts[0] * static_cast<std::size_t>(p),
                                            [&](std::size_t) { return 1.0 * r; });
  View1<double> vin = filled<double>(received + 1, [](std::size_t) { return -1.0; });
  g.all_to_all_v(exec, vout, send_counts, vin, recv_counts);
  std::vector<double> want;
  for (int k = 0; k < p; ++k)
    want.insert(want.end(), static_cast<std::size_t>(k + 1), 1.0 * k);
  want.push_back(-1.0); // past the received elements: untouched
  EXPECT_EQ(to_host(vin), want);

  View1<double> b = filled<double>(n, [&](std::size_t i) { return value(r, i); });
  g.broadcast(exec, b, p - 1);
  View1<double> sum("sum", r == 0 ? n : 0);
  g.reduce(exec, filled<double>(n, [&](std::size_t i) { return value(r, i); }), sum, 0);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(to_host(b)[i], value(p - 1, i));
    if (r == 0) {
      EXPECT_EQ(to_host(sum)[i], to_host(a)[i]);
    }
  }

  if (p < 2)
    return;
  // Blocking pairs (0,1), (2,3), ...: the lower rank sends first.
  const int partner = r ^ 1;
  if (partner < p) {
    View1<double> got("got", n);
    const View1<double> sent = filled<double>(n, [&](std::size_t i) { return value(r, i); });
    if (r < partner) {
      g.send(exec, sent, partner);
      g.recv(exec, got, partner);
    } else {
      g.recv(exec, got, partner);
      g.send(exec, sent, partner);
    }
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_EQ(to_host(got)[i], value(partner, i));
  }
  // A ring both ways with isend/irecv, then with an in-order Batch.
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const View1<double> sent = filled<double>(n, [&](std::size_t i) { return value(r, i); });
  View1<double> from_prev("from_prev", n), from_next("from_next", n);
  {
    std::vector<Request> rs;
    rs.push_back(g.irecv(exec, from_prev, prev, 1));
    rs.push_back(g.irecv(exec, from_next, next, 2));
    rs.push_back(g.isend(exec, sent, next, 1));
    rs.push_back(g.isend(exec, sent, prev, 2));
    wait_all(rs);
  }
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(to_host(from_prev)[i], value(prev, i));
    EXPECT_EQ(to_host(from_next)[i], value(next, i));
  }
  View1<double> batched("batched", n);
  {
    Batch batch(g, Matching::in_order);
    batch.send(sent, next);
    batch.recv(batched, prev);
    std::vector<Request> rs = batch.post(exec);
    wait_all(rs);
  }
  for (std::size_t i = 0; i < n; ++i)
    EXPECT_EQ(to_host(batched)[i], value(prev, i));
}

} // namespace

TEST(SharedDevices, StagedRouteGivesTheSameResultsAndReusesItsBuffers) {
  const int n = world_size();
  CommOptions o;
  o.stage_host_memory = true;            // host memory too takes the staged route
  o.devices = patterns(n).at("one gpu"); // device memory: every group shares a GPU
  const Group world("world", Communicator::world(), std::make_shared<TrafficCounters>(), o);
  EXPECT_EQ(world.shares_device(), n > 1);
  std::vector<const Group*> groups{&world};
  std::unique_ptr<ProcessGrid> grid;
  if (n % 2 == 0) {
    grid = std::make_unique<ProcessGrid>(Layout{n / 2, 1, 2, TensorMode::d1}, Communicator::world(),
                                         o);
    groups.push_back(&grid->tp());
    groups.push_back(&grid->dp());
  }
  for (const Group* g : groups) {
    SCOPED_TRACE(g->name());
    // Device memory: staged wherever two members share the GPU (all of them here).
    EXPECT_EQ(g->device_collective_route(), expected_route(g->size() > 1, o));
    run_every_operation(*g); // warm: the group's staging buffers are made
    if (g->size() > 1) {
      EXPECT_GT(g->staging().buffers(), 0u);
    }
    const std::size_t warm = g->staging().buffers();
    g_stage_allocations = 0;
    Kokkos::Tools::Experimental::set_allocate_data_callback(count_stage);
    run_every_operation(*g);
    run_every_operation(*g);
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    EXPECT_EQ(g->staging().buffers(), warm);
    EXPECT_EQ(g_stage_allocations, 0) << "staging buffers allocated once warm";
  }
}

// The peak MFU is measured against: each node's first rank measures while the node's
// other ranks wait; every rank gets the value and its share of the node's CPUs.
TEST(NodePeak, SharesOfTheNodeClosedForm) {
  NodePeak p;
  p.alone = 100;
  p.ranks = 4;
  p.cpus = 2;
  EXPECT_DOUBLE_EQ(p.share(), 0.5); // 4 single-threaded ranks take turns on 2 CPUs
  EXPECT_DOUBLE_EQ(p.per_rank(), 50);
  p.ranks = 2;
  EXPECT_DOUBLE_EQ(p.share(), 1.0);
  p.ranks = 1;
  p.cpus = 16;
  p.threads = 4;
  EXPECT_DOUBLE_EQ(p.share(), 1.0); // more CPUs than threads: the peak stays the rank's own
  p.ranks = 4;
  p.cpus = 8;
  EXPECT_DOUBLE_EQ(p.share(), 0.5);
}

TEST(NodePeak, MeasuredOnceOnEachNode) {
  int calls = 0;
  const NodePeak p = measure_node_peak(
      [&] {
        ++calls;
        return 42.5;
      },
      1);
  EXPECT_EQ(p.alone, 42.5);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0, node_calls = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Allreduce(&calls, &node_calls, 1, MPI_INT, MPI_SUM, node);
  MPI_Comm_free(&node);
  EXPECT_EQ(node_calls, 1);
  EXPECT_EQ(p.ranks, node_size);
  // A host build counts the node's CPUs; a device build its distinct GPUs, one
  // thread each (here the node's ranks may share one GPU).
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const auto& devices = world_devices();
  const bool gpu = static_cast<std::size_t>(world_rank) < devices.size() &&
                   !devices[static_cast<std::size_t>(world_rank)].device.empty();
  if (gpu) {
    EXPECT_GE(p.cpus, 1);
    EXPECT_LE(p.cpus, node_size);
    EXPECT_EQ(p.threads, 1);
  } else {
    EXPECT_GE(p.cpus, static_cast<int>(launch_cpus().size()));
  }
  EXPECT_GT(p.share(), 0.0);
  EXPECT_LE(p.share(), 1.0);
}
