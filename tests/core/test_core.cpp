// core: failure reports, error kinds, the Kokkos shims, host memory readings; the traffic
// cost model.

#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/memory_check.hpp"
#include "cubelm/core/memory_info.hpp"
#include "cubelm/core/placement.hpp"
#include "cubelm/core/stop.hpp"
#include "cubelm/core/types.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace cubelm;

TEST(Core, FailureReportNamesRankFileLineCallAndMessage) {
  const std::string s = detail::format_failure(3, "NCCL", "ncclAllReduce(x)",
                                               "unhandled cuda error", "src/comm/a.cpp", 42);
  EXPECT_EQ(s, "cubelm: rank 3: NCCL error at src/comm/a.cpp:42: ncclAllReduce(x): "
               "unhandled cuda error");
}

TEST(Core, FailureReportsNameTheSourceFromTheCheckoutsTopFolder) {
  EXPECT_EQ(detail::source_path("/home/u/cubelm/src/io/checkpoint.cpp"), "src/io/checkpoint.cpp");
  EXPECT_EQ(detail::source_path("../../../src/io/checkpoint.cpp"), "src/io/checkpoint.cpp");
  EXPECT_EQ(detail::source_path("/x/include/cubelm/core/error.hpp"),
            "include/cubelm/core/error.hpp");
  EXPECT_EQ(detail::source_path("check_failure.cpp"), "check_failure.cpp");
  const std::string s = detail::format_failure(0, "MPI", "MPI_Send(x)", "invalid rank",
                                               "/build/cubelm/src/comm/a.cpp", 7);
  EXPECT_EQ(s, "cubelm: rank 0: MPI error at src/comm/a.cpp:7: MPI_Send(x): invalid rank");
}

TEST(Core, AssertThrowsWithFileAndLine) {
  try {
    CUBELM_ASSERT(1 + 1 == 3, "arithmetic still works");
    FAIL();
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("test_core.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("1 + 1 == 3"), std::string::npos) << m;
    EXPECT_NE(m.find("arithmetic still works"), std::string::npos) << m;
  }
}

TEST(Core, ErrorsKnowWhetherTheyAreCollective) {
  EXPECT_FALSE(Error("x").collective());
  EXPECT_TRUE(Error("x", true).collective());
}

namespace {
// A device lambda may not live inside a TEST body (a private member function) with nvcc.
Kokkos::View<double*, MemSpace> run_shims() {
  Kokkos::View<double*, MemSpace> out("out", 3);
  Kokkos::parallel_for(
      "shim", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(const int) {
        out(0) = kmath::sqrt(16.0);
        out(1) = kmath::tanh(0.0);
        out(2) = kmath::exp(0.0) + kmath::fabs(-2.0) + kmath::log(1.0);
      });
  return out;
}
} // namespace

TEST(Core, KokkosShimsComputeInKernels) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), run_shims());
  EXPECT_DOUBLE_EQ(h(0), 4.0);
  EXPECT_DOUBLE_EQ(h(1), 0.0);
  EXPECT_DOUBLE_EQ(h(2), 3.0);
  EXPECT_EQ(compat::kokkos_version_string().substr(0, 1),
            std::to_string(KOKKOS_VERSION / 10000).substr(0, 1));
}

TEST(Traffic, CostModelClosedForms) {
  using comm::Kind;
  using comm::modeled_bytes_sent;
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::all_reduce, 4, 400), 600);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::all_reduce, 1, 400), 0);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::all_gather, 8, 10), 70);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::reduce_scatter, 2, 10), 10);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::broadcast, 4, 400), 300);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::reduce, 3, 300), 200);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::send, 9, 5), 5);
  EXPECT_DOUBLE_EQ(modeled_bytes_sent(Kind::recv, 9, 5), 0);
}

TEST(Traffic, CountersAccumulatePerGroupAndKind) {
  comm::TrafficCounters c;
  c.add("tp", comm::Kind::all_reduce, 10);
  c.add("tp", comm::Kind::all_reduce, 5);
  c.add("tp", comm::Kind::all_gather, 1);
  c.add("dp", comm::Kind::all_reduce, 100);
  EXPECT_EQ(c.calls("tp", comm::Kind::all_reduce), 2u);
  EXPECT_DOUBLE_EQ(c.bytes("tp", comm::Kind::all_reduce), 15);
  EXPECT_DOUBLE_EQ(c.bytes("tp"), 16);
  EXPECT_DOUBLE_EQ(c.total_bytes(), 116);
  const auto rows = c.entries();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].group, "dp");
  EXPECT_STREQ(comm::kind_name(rows[1].kind), "all_reduce");
  c.reset();
  EXPECT_DOUBLE_EQ(c.total_bytes(), 0);
  EXPECT_TRUE(c.entries().empty());
}

namespace {
RankPlacement placed(int rank, int threads, std::vector<int> cpus, bool pins = false,
                     bool yields = false) {
  RankPlacement p;
  p.rank = rank;
  p.threads = threads;
  p.cpus = std::move(cpus);
  p.pins_threads = pins;
  p.yields = yields;
  return p;
}
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& w : v)
    s += w + "\n";
  return s;
}
} // namespace

TEST(Placement, CpuListsCompressRuns) {
  EXPECT_EQ(cpu_list({}), "");
  EXPECT_EQ(cpu_list({3}), "3");
  EXPECT_EQ(cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
}

TEST(Placement, SoundLayoutsGiveNoWarning) {
  // One rank per core pair, each bound to its own cores, threads pinned inside.
  EXPECT_TRUE(
      placement_warnings({placed(0, 2, {0, 1}, true), placed(1, 2, {2, 3}, true)}, "n").empty());
  // One process using the whole node.
  EXPECT_TRUE(placement_warnings({placed(0, 4, {0, 1, 2, 3}, true)}, "n").empty());
  // Unbound single-threaded ranks that fit, OpenMP not pinning.
  EXPECT_TRUE(placement_warnings({placed(0, 1, {0, 1}), placed(1, 1, {0, 1})}, "n").empty());
}

TEST(Placement, MoreThreadsThanCoresIsNamedWithAFairShare) {
  // What an unplaced launch of 4 ranks does on 2 cores: 2 threads each, pinned.
  std::vector<RankPlacement> node;
  for (int r = 0; r < 4; ++r)
    node.push_back(placed(r, 2, {0, 1}, true));
  const std::string w = joined(placement_warnings(node, "node7"));
  EXPECT_NE(w.find("node7: 4 ranks run 8 threads in all on 2 CPUs"), std::string::npos) << w;
  EXPECT_NE(w.find("Give each rank 1 thread"), std::string::npos) << w;
  // ...and the pinned threads of ranks 0 and 1 start on the same core.
  EXPECT_NE(w.find("ranks 0 and 1 may both run on CPUs 0-1"), std::string::npos) << w;

  const std::string eight = joined(placement_warnings(
      {placed(0, 16, {0, 1, 2, 3, 4, 5, 6, 7}), placed(1, 16, {0, 1, 2, 3, 4, 5, 6, 7})}, "n"));
  EXPECT_NE(eight.find("Give each rank 4 threads"), std::string::npos) << eight;
  EXPECT_NE(eight.find("--map-by slot:PE=4"), std::string::npos) << eight;
}

TEST(Placement, OversubscribedSingleThreadedRanksAskForYielding) {
  std::vector<RankPlacement> busy, yielding;
  for (int r = 0; r < 8; ++r) {
    busy.push_back(placed(r, 1, {0, 1}));
    yielding.push_back(placed(r, 1, {0, 1}, false, true));
  }
  const std::string w = joined(placement_warnings(busy, "n"));
  EXPECT_NE(w.find("8 ranks share 2 CPUs (oversubscribed) and MPI busy-polls"), std::string::npos)
      << w;
  EXPECT_NE(w.find("OMPI_MCA_mpi_yield_when_idle=1"), std::string::npos) << w;
  const std::string y = joined(placement_warnings(yielding, "n"));
  EXPECT_NE(y.find("8 ranks share 2 CPUs (oversubscribed; waiting ranks yield"), std::string::npos)
      << y;
  EXPECT_EQ(y.find("busy-polls"), std::string::npos) << y;
}

TEST(Placement, RankBoundToFewerCoresThanThreads) {
  // Enough cores on the node (7 threads, 10 CPUs), but rank 1 got a single core for its 4 threads.
  const std::string w = joined(placement_warnings(
      {placed(0, 2, {0, 1, 2, 3}), placed(1, 4, {4}), placed(2, 1, {5, 6, 7, 8, 9})}, "n"));
  EXPECT_NE(w.find("rank 1 runs 4 threads on CPU 4"), std::string::npos) << w;
  EXPECT_EQ(w.find("rank 0 "), std::string::npos) << w;
  EXPECT_EQ(w.find("in all"), std::string::npos) << w;
}

TEST(Placement, PinnedThreadsOfRanksSharingCpus) {
  // Two single-threaded ranks fit on 2 cores, but OMP_PROC_BIND pins both to CPU 0.
  const std::string w =
      joined(placement_warnings({placed(0, 1, {0, 1}, true), placed(1, 1, {0, 1}, true)}, "n"));
  EXPECT_NE(w.find("OpenMP pins threads"), std::string::npos) << w;
  EXPECT_NE(w.find("OMP_PROC_BIND=false"), std::string::npos) << w;
  EXPECT_TRUE(placement_warnings({placed(0, 1, {0}, true), placed(1, 1, {1}, true)}, "n").empty());
}

// Memory admission: MemAvailable and the memory cgroup, read from fake files.
namespace {

struct FakeRoot {
  std::string path;
  FakeRoot() {
    char name[] = "/tmp/cubelm_meminfo_XXXXXX";
    path = mkdtemp(name);
  }
  ~FakeRoot() { std::filesystem::remove_all(path); }
  void write(const std::string& file, const std::string& text) const {
    const std::filesystem::path p = std::filesystem::path(path) / file;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
};

const char* kMeminfo = "MemTotal:       32000000 kB\n"
                       "MemFree:         1000000 kB\n"
                       "MemAvailable:   20000000 kB\n"
                       "Buffers:          100000 kB\n";

} // namespace

TEST(MemoryInfo, MemAvailableIsReadInBytes) {
  FakeRoot proc;
  proc.write("meminfo", kMeminfo);
  EXPECT_EQ(read_mem_available(proc.path), 20000000ull * 1024);
  FakeRoot none;
  EXPECT_FALSE(read_mem_available(none.path).has_value());
  none.write("meminfo", "MemTotal: 1000 kB\n");
  EXPECT_FALSE(read_mem_available(none.path).has_value());
}

TEST(MemoryInfo, CgroupV2LimitMinusUsage) {
  FakeRoot proc, cg;
  proc.write("meminfo", kMeminfo);
  cg.write("memory.max", "8589934592\n");     // 8 GiB
  cg.write("memory.current", "1073741824\n"); // 1 GiB
  const HostMemory m = read_host_memory(proc.path, cg.path);
  EXPECT_EQ(m.cgroup_version, "v2");
  EXPECT_EQ(m.cgroup_headroom(), 7ull << 30);
  EXPECT_EQ(m.available(), 7ull << 30); // below MemAvailable (19 GiB)
  EXPECT_NE(m.describe().find("cgroup v2 limit 8.0 GiB - usage 1.0 GiB"), std::string::npos)
      << m.describe();
  // A cgroup over its limit leaves nothing.
  cg.write("memory.current", "9000000000\n");
  EXPECT_EQ(read_host_memory(proc.path, cg.path).available(), 0u);
}

TEST(MemoryInfo, CgroupV2MaxMeansNoLimit) {
  FakeRoot proc, cg;
  proc.write("meminfo", kMeminfo);
  cg.write("memory.max", "max\n");
  cg.write("memory.current", "1073741824\n");
  const HostMemory m = read_host_memory(proc.path, cg.path);
  EXPECT_FALSE(m.cgroup_limit.has_value());
  EXPECT_EQ(m.available(), 20000000ull * 1024);
}

TEST(MemoryInfo, CgroupV1LimitAndUnlimited) {
  FakeRoot proc, cg;
  proc.write("meminfo", kMeminfo);
  cg.write("memory/memory.limit_in_bytes", "4294967296\n"); // 4 GiB
  cg.write("memory/memory.usage_in_bytes", "1073741824\n");
  HostMemory m = read_host_memory(proc.path, cg.path);
  EXPECT_EQ(m.cgroup_version, "v1");
  EXPECT_EQ(m.available(), 3ull << 30);
  // v1 writes "no limit" as LONG_MAX rounded down to a page.
  cg.write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  m = read_host_memory(proc.path, cg.path);
  EXPECT_FALSE(m.cgroup_limit.has_value());
  EXPECT_EQ(m.available(), 20000000ull * 1024);
}

TEST(MemoryInfo, MissingFiles) {
  FakeRoot proc, cg;
  // Nothing readable: nothing known.
  EXPECT_FALSE(read_host_memory(proc.path, cg.path).available().has_value());
  // Only a cgroup limit (usage missing counts as 0).
  cg.write("memory.max", "2147483648\n");
  const HostMemory m = read_host_memory(proc.path, cg.path);
  EXPECT_EQ(m.available(), 2ull << 30);
  EXPECT_EQ(m.describe(), "cgroup v2 limit 2.0 GiB - usage 0 B");
  // Only MemAvailable.
  proc.write("meminfo", kMeminfo);
  EXPECT_EQ(read_host_memory(proc.path, proc.path + "/none").available(), 20000000ull * 1024);
}

TEST(MemoryInfo, BytesInBinaryUnitsUpToGiB) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3.5 * 1048576), "3.5 MiB");
  EXPECT_EQ(format_bytes(1.5 * 1073741824.0), "1.5 GiB");
  EXPECT_EQ(format_bytes(2048.0 * 1073741824.0), "2048.0 GiB");
  EXPECT_EQ(usable_memory(1000), 900u);
}

// ---------------------------------------------------------------------------
// Stopping early: signals, the job's end time, the deadline's arithmetic.

TEST(Stop, SignalsAreRecordedNotFatal) {
  {
    const StopSignals signals;
    EXPECT_EQ(StopSignals::received(), 0);
    std::raise(SIGUSR1); // would end the process without the handler
    EXPECT_EQ(StopSignals::received(), SIGUSR1);
    std::raise(SIGTERM); // the first one is kept
    EXPECT_EQ(StopSignals::received(), SIGUSR1);
    StopSignals::clear();
    std::raise(SIGTERM);
    EXPECT_EQ(StopSignals::received(), SIGTERM);
  }
  // The previous disposition is back: ignore SIGUSR1 to prove it without dying.
  struct sigaction now;
  sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
}

namespace {
std::map<std::string, std::string> fake_env;
const char* fake_get(const char* name) {
  const auto it = fake_env.find(name);
  return it == fake_env.end() ? nullptr : it->second.c_str();
}
} // namespace

TEST(Stop, EndTimeFromTheEnvironment) {
  fake_env.clear();
  EXPECT_EQ(end_time_from_environment(fake_get).epoch_s, 0);
  fake_env["SLURM_JOB_END_TIME"] = "1900000000";
  EndTime end = end_time_from_environment(fake_get);
  EXPECT_EQ(end.epoch_s, 1900000000.0);
  EXPECT_EQ(end.source, "SLURM_JOB_END_TIME");
  fake_env["CUBELM_END_TIME"] = "1800000000"; // the earlier one wins
  end = end_time_from_environment(fake_get);
  EXPECT_EQ(end.epoch_s, 1800000000.0);
  EXPECT_EQ(end.source, "CUBELM_END_TIME");
  for (const char* bad : {"soon", "-5", "12:00:00", "17e8"}) {
    fake_env["CUBELM_END_TIME"] = bad;
    try {
      end_time_from_environment(fake_get);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("CUBELM_END_TIME = \"") + bad + "\""),
                std::string::npos)
          << e.what();
      EXPECT_TRUE(e.collective());
    }
  }
}

TEST(Stop, DeadlineIsTheEarlierLimit) {
  using Clock = Deadline::Clock;
  const Clock::time_point start = Clock::now();
  const Deadline none(0, start, EndTime{}, 1e9);
  EXPECT_FALSE(none.limited());
  EXPECT_FALSE(none.too_near(1e9));
  EXPECT_EQ(none.describe(), "none");

  const Deadline own(60, start, EndTime{}, 1e9);
  EXPECT_TRUE(own.limited());
  EXPECT_NEAR(own.seconds_left(start), 60, 1e-6);
  EXPECT_FALSE(own.too_near(59, start));
  EXPECT_TRUE(own.too_near(61, start));
  EXPECT_TRUE(own.too_near(1, start + std::chrono::seconds(60)));
  EXPECT_NE(own.describe().find("train.time_limit_s = 60"), std::string::npos);
  // Before any checkpoint is timed: its size at the assumed rate; then the longest one.
  EXPECT_NEAR(own.save_estimate(0), 1e9 / kAssumedWriteRate, 1e-9);
  EXPECT_NEAR(own.save_estimate(30), 30, 1e-9);

  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const Deadline job(60, Clock::now(), EndTime{wall + 20, "SLURM_JOB_END_TIME"}, 0);
  EXPECT_NEAR(job.seconds_left(), 20, 1.0);
  EXPECT_NE(job.describe().find("SLURM_JOB_END_TIME"), std::string::npos);
  const Deadline later(10, Clock::now(), EndTime{wall + 3600, "CUBELM_END_TIME"}, 0);
  EXPECT_NEAR(later.seconds_left(), 10, 1.0);
}
