// Ranks that share a GPU (docs/communication.md, "Ranks that share a GPU"): the pure
// decision over device keys and its one-line message; the group-level decision with
// device keys injected through CommOptions::devices, against member lists written out
// by hand for each pattern.

#include "cubelm/comm/devices.hpp"
#include "cubelm/comm/grid.hpp"
#include "cubelm/core/devices.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/types.hpp"

#include <gtest/gtest.h>

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
