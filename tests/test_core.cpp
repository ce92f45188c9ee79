// core: failure reports, error kinds, the Kokkos shims; the traffic cost model.

#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/types.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace cubelm;

TEST(Core, FailureReportNamesRankFileLineCallAndMessage) {
  const std::string s = detail::format_failure(3, "NCCL", "ncclAllReduce(x)",
                                               "unhandled cuda error", "src/comm/a.cpp", 42);
  EXPECT_EQ(s, "cubelm: rank 3: NCCL error at src/comm/a.cpp:42: ncclAllReduce(x): "
               "unhandled cuda error");
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
