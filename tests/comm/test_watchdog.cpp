// The hang watchdog's bookkeeping (comm/watchdog.hpp): arming, the waits that
// Group's blocking calls and Request::wait mark (seen from a second thread while
// the last rank arrives late), the training context and the message. Aborting a
// job is what the cli_hang_* tests check, with real stopped ranks.

#include "cubelm/comm/group.hpp"
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/types.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

using namespace cubelm;
using namespace cubelm::comm;

namespace {

// fence_timing: a blocking call on device memory that NCCL only enqueues is waited for
// inside the call's watched scope, as the early ranks' waits below need.
Group world_group(const std::string& name) {
  CommOptions options = CommOptions::from_environment();
  options.fence_timing = true;
  return Group(name, Communicator::world(), std::make_shared<TrafficCounters>(), options);
}

// What a second thread of this rank sees as the wait in progress while `op` runs,
// the last rank entering `op` half a second after the others: the first wait it
// sees, or none.
watchdog::Wait seen_during(const Group& g, const std::function<void()>& op) {
  watchdog::Wait seen;
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done.load()) {
      const watchdog::Wait w = watchdog::current();
      if (w.group != nullptr) {
        seen = w;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  if (g.rank() == g.size() - 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  op();
  done.store(true);
  sampler.join();
  return seen;
}

#define EXPECT_WAIT(seen, group_name, op_name)                                                     \
  do {                                                                                             \
    ASSERT_NE((seen).group, nullptr) << "no wait seen during " << (op_name);                       \
    EXPECT_EQ(std::string((seen).group), (group_name));                                            \
    EXPECT_EQ(std::string((seen).op), (op_name));                                                  \
    EXPECT_GT((seen).seconds, 0.0);                                                                \
    EXPECT_LT((seen).seconds, 60.0);                                                               \
  } while (0)

} // namespace

TEST(Watchdog, ArmedOnlyByAPositiveTimeoutTheShortestApplies) {
  EXPECT_FALSE(watchdog::armed());
  {
    const Watchdog off(0), negative(-5);
    EXPECT_FALSE(watchdog::armed());
    EXPECT_EQ(watchdog::timeout_s(), 0.0);
  }
  {
    const Watchdog slow(600);
    EXPECT_TRUE(watchdog::armed());
    EXPECT_EQ(watchdog::timeout_s(), 600.0);
    {
      const Watchdog fast(2.5);
      EXPECT_EQ(watchdog::timeout_s(), 2.5);
    }
    EXPECT_EQ(watchdog::timeout_s(), 600.0);
  }
  EXPECT_FALSE(watchdog::armed());
  EXPECT_EQ(watchdog::timeout_s(), 0.0);
}

TEST(Watchdog, ScopesMarkWaitsOnlyWhileArmed) {
  const char* g = watchdog::intern("tp");
  EXPECT_EQ(g, watchdog::intern(std::string("t") + "p")); // one pointer per name
  {
    const watchdog::Scope unarmed(g, "all_reduce");
    EXPECT_EQ(watchdog::current().group, nullptr);
  }
  const Watchdog armed(3600);
  EXPECT_EQ(watchdog::current().group, nullptr);
  watchdog::set_step(7);
  watchdog::set_micro_batch(2);
  {
    const watchdog::Scope outer(g, "all_reduce");
    EXPECT_STREQ(watchdog::current().op, "all_reduce");
    {
      const watchdog::Scope inner(watchdog::intern("pp"), "irecv");
      const watchdog::Wait w = watchdog::current();
      EXPECT_STREQ(w.group, "pp");
      EXPECT_STREQ(w.op, "irecv");
      EXPECT_EQ(w.step, 7);
      EXPECT_EQ(w.micro, 2);
    }
    EXPECT_STREQ(watchdog::current().group, "tp"); // back in the enclosing wait
    EXPECT_STREQ(watchdog::current().op, "all_reduce");
  }
  EXPECT_EQ(watchdog::current().group, nullptr);
  watchdog::set_step(-1);
  watchdog::set_micro_batch(-1);
}

// Every kind of blocking call marks its wait, library call included: the blocking
// collectives (MPI_Allreduce, MPI_Bcast, ... inside the backend), barrier, and
// Request::wait of the non-blocking operations.
TEST(Watchdog, BlockingCallsAreWatchedWaits) {
  const Group g = world_group("wd");
  if (g.size() < 2)
    GTEST_SKIP() << "needs a partner that arrives late";
  const Watchdog armed(3600);
  const ExecSpace exec;
  const bool early = g.rank() < g.size() - 1; // only these wait
  View1<double> v("v", 4);
  View1<double> all("all", 4 * static_cast<std::size_t>(g.size()));
  const auto check = [&](const char* op, const std::function<void()>& call) {
    const watchdog::Wait seen = seen_during(g, call);
    if (early)
      EXPECT_WAIT(seen, "wd", op);
  };
  check("barrier", [&] { g.barrier(); });
  check("all_reduce", [&] { g.all_reduce(exec, v); });
  check("broadcast", [&] { g.broadcast(exec, v, g.size() - 1); });
  check("all_gather", [&] { g.all_gather(exec, v, all); });
  check("iall_reduce", [&] {
    Request r = g.iall_reduce(exec, v);
    r.wait();
  });
  // Point to point: rank 0 waits for the last rank's message. Device memory sent with
  // send goes through NCCL and with isend through MPI: pair send with recv and isend
  // with irecv (docs/communication.md).
  const int last = g.size() - 1;
  const auto point_to_point = [&](bool blocking) {
    return seen_during(g, [&] {
      if (g.rank() == 0) {
        if (blocking)
          g.recv(exec, v, last);
        else
          g.irecv(exec, v, last).wait();
      } else if (g.rank() == last) {
        if (blocking)
          g.send(exec, v, 0);
        else
          g.isend(exec, v, 0).wait();
      }
    });
  };
  const watchdog::Wait blocking = point_to_point(true);
  const watchdog::Wait nonblocking = point_to_point(false);
  if (g.rank() == 0) {
    EXPECT_WAIT(blocking, "wd", "recv");
    EXPECT_WAIT(nonblocking, "wd", "irecv");
  }
  EXPECT_EQ(watchdog::current().group, nullptr);
}

TEST(Watchdog, MessageNamesRankGroupOperationStepAndMicroBatch) {
  watchdog::Stall s;
  s.rank = 2;
  s.group = "tp";
  s.op = "all_reduce";
  s.seconds = 5.04;
  s.step = 3;
  s.micro = 0;
  s.timeout_s = 5;
  EXPECT_EQ(watchdog::describe(s),
            "cubelm: rank 2: no progress for 5.0 s in all_reduce on group 'tp' (step 3, "
            "micro-batch 0); parallel.timeout_s = 5; aborting the job");
  s.micro = -1;
  s.timeout_s = 2.5;
  EXPECT_EQ(watchdog::describe(s),
            "cubelm: rank 2: no progress for 5.0 s in all_reduce on group 'tp' (step 3, outside "
            "the micro-batches); parallel.timeout_s = 2.5; aborting the job");
  s.step = -1;
  s.where = "on the GPU (NCCL)";
  EXPECT_EQ(watchdog::describe(s),
            "cubelm: rank 2: no progress for 5.0 s in all_reduce on group 'tp' on the GPU (NCCL) "
            "(before the first step); parallel.timeout_s = 2.5; aborting the job");
  s.error = "NCCL error (remote process exited or there was a network error)";
  s.where.clear();
  s.step = 4;
  s.micro = 1;
  EXPECT_EQ(watchdog::describe(s),
            "cubelm: rank 2: NCCL error (remote process exited or there was a network error) in "
            "all_reduce on group 'tp' (step 4, micro-batch 1); aborting the job");
}
