#pragma once
// What every MPI benchmark program shares: rank 0 reports, the other ranks run
// the same benchmarks (their collectives need every rank) and stay silent.

#include <benchmark/benchmark.h>

#include <vector>

namespace cubelm::perf {

class SilentReporter : public benchmark::BenchmarkReporter {
public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

/// Initializes Google Benchmark and runs what is registered; reports on `world_rank` 0.
inline void run_benchmarks(int world_rank, int& argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (world_rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
}

} // namespace cubelm::perf
