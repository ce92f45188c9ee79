// Collective throughput on host Views through cubelm's comm layer.
//   mpiexec -n 4 build/cpu/perf/bench_collectives
// Every rank runs the same fixed number of iterations (an adaptive count would
// differ between ranks and deadlock the collectives); rank 0 reports. The
// bytes/s column is the modelled bytes this rank sends (docs/communication.md).

#include "cubelm/comm/grid.hpp"
#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/environment.hpp"
#include "cubelm/core/types.hpp"

#include "bench_mpi.hpp"

#include <benchmark/benchmark.h>

#include <memory>

namespace {

std::unique_ptr<cubelm::comm::Group> g_world;
constexpr int kIterations = 40;

void bytes_sent(benchmark::State& state, const cubelm::comm::TrafficCounters& before_after,
                double before) {
  state.SetBytesProcessed(static_cast<std::int64_t>(before_after.total_bytes() - before));
  state.counters["ranks"] = g_world->size();
}

void BM_AllReduce(benchmark::State& state) {
  cubelm::View1<float> v("v", static_cast<std::size_t>(state.range(0)));
  const cubelm::ExecSpace exec;
  const double before = g_world->traffic().total_bytes();
  for (auto _ : state)
    g_world->all_reduce(exec, v);
  bytes_sent(state, g_world->traffic(), before);
}

void BM_AllGather(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  cubelm::View1<float> send("send", n), recv("recv", n * g_world->size());
  const cubelm::ExecSpace exec;
  const double before = g_world->traffic().total_bytes();
  for (auto _ : state)
    g_world->all_gather(exec, send, recv);
  bytes_sent(state, g_world->traffic(), before);
}

void BM_Broadcast(benchmark::State& state) {
  cubelm::View1<float> v("v", static_cast<std::size_t>(state.range(0)));
  const cubelm::ExecSpace exec;
  const double before = g_world->traffic().total_bytes();
  for (auto _ : state)
    g_world->broadcast(exec, v, 0);
  bytes_sent(state, g_world->traffic(), before);
}

// The hang watchdog's cost (docs/reliability.md) where it is largest relative to
// the work: a 16-float all_reduce, with the watchdog off (0) and armed (1).
void BM_AllReduceWatchdog(benchmark::State& state) {
  const cubelm::comm::Watchdog watchdog(state.range(0) != 0 ? 600.0 : 0.0);
  cubelm::View1<float> v("v", 16);
  const cubelm::ExecSpace exec;
  const double before = g_world->traffic().total_bytes();
  for (auto _ : state)
    g_world->all_reduce(exec, v);
  bytes_sent(state, g_world->traffic(), before);
}

// One watched wait without MPI: the watchdog's bookkeeping alone, off (0) and armed (1).
void BM_WatchdogScope(benchmark::State& state) {
  const cubelm::comm::Watchdog watchdog(state.range(0) != 0 ? 600.0 : 0.0);
  const char* group = cubelm::comm::watchdog::intern("world");
  for (auto _ : state) {
    const cubelm::comm::watchdog::Scope waiting(group, "all_reduce");
    benchmark::ClobberMemory();
  }
}

BENCHMARK(BM_AllReduce)->RangeMultiplier(16)->Range(1 << 10, 1 << 22)->Iterations(kIterations);
BENCHMARK(BM_AllGather)->RangeMultiplier(16)->Range(1 << 10, 1 << 20)->Iterations(kIterations);
BENCHMARK(BM_Broadcast)->RangeMultiplier(16)->Range(1 << 10, 1 << 22)->Iterations(kIterations);
BENCHMARK(BM_AllReduceWatchdog)->Arg(0)->Arg(1)->Arg(0)->Arg(1)->Iterations(20000);
BENCHMARK(BM_WatchdogScope)->Arg(0)->Arg(1)->Iterations(10000000);

} // namespace

int main(int argc, char** argv) {
  cubelm::Environment env(argc, argv);
  {
    g_world =
        std::make_unique<cubelm::comm::Group>("world", cubelm::comm::Communicator::world(),
                                              std::make_shared<cubelm::comm::TrafficCounters>());
    cubelm::perf::run_benchmarks(env.world_rank(), argc, argv);
    g_world.reset();
  }
  return 0;
}
