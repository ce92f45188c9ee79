// The pipeline schedules side by side: training steps of one model with every
// rank a pipeline stage (pipeline_size = world size), under gpipe, 1f1b,
// interleaved (2 chunks per stage) and layered.
//   OMP_NUM_THREADS=1 mpiexec -n 8 build/cpu/perf/bench_pipeline
// Every rank runs the same fixed number of steps; rank 0 reports. Counters:
// the unit-cost idle/busy ratio of the fullest stage (the schedule's bubble,
// no wall clock), the wall-clock share of the step rank 0 waited for other
// stages, memory per rank (the largest over the stages, as `cubelm check`
// estimates it, and rank 0's as allocated) and the activation sets rank 0
// holds. Model: L = 2 x world layers, H256 a8 T128 V1024, 16 micro-batches of
// one sequence.
#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/environment.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/train/trainer.hpp"

#include "bench_mpi.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

constexpr int kSteps = 5;

cubelm::Deck deck(const char* schedule, int stages) {
  const bool interleaved = std::string(schedule) == "interleaved";
  const std::string text =
      "[model]\nvocab_size = 1024\nseq_len = 128\nhidden = 256\nheads = 8\nlayers = " +
      std::to_string(2 * stages) + "\n[parallel]\npipeline_size = " + std::to_string(stages) +
      "\nschedule = \"" + schedule + "\"\nvirtual_stages = " + (interleaved ? "2" : "1") +
      "\nmicrobatches = 16\n[train]\nsteps = 1000\nglobal_batch = 16\nseed = 1\n"
      "[data]\nsynthetic_tokens = 200000\n[log]\npeak_gflops = 1.0\n";
  return cubelm::cost::parse_deck(text, "bench_pipeline");
}

void BM_Schedule(benchmark::State& state, const char* schedule) {
  const int world = cubelm::comm::Communicator::world().size();
  const cubelm::Deck d = deck(schedule, world);
  cubelm::train::Trainer trainer(d);
  trainer.step(); // warm-up
  double wait = 0, total = 0;
  for (auto _ : state) {
    const auto m = trainer.step();
    wait += m.wait_ms;
    total += m.ms;
  }
  const auto& timeline = trainer.timeline();
  double bubble = 0;
  for (int s = 0; s < world; ++s)
    bubble = std::max(bubble, timeline.bubble(s));
  state.counters["stages"] = world;
  state.counters["idle/busy"] = bubble;
  state.counters["wait_share_rank0"] = total > 0 ? wait / total : 0.0;
  state.counters["est_MiB/rank_max"] =
      static_cast<double>(cubelm::cost::estimate_memory(d).total()) / 1048576.0;
  state.counters["MiB_rank0"] = static_cast<double>(trainer.memory().total()) / 1048576.0;
  state.counters["act_sets_rank0"] = trainer.model().stage().slots;
}

} // namespace

int main(int argc, char** argv) {
  cubelm::kernels::ensure_blas_kernels(argv); // the kernels cubelm runs (kernels/blas.hpp)
  cubelm::Environment env(argc, argv);
  {
    for (const char* s : {"gpipe", "1f1b", "interleaved", "layered"})
      benchmark::RegisterBenchmark((std::string("pipeline/") + s).c_str(), BM_Schedule, s)
          ->Iterations(kSteps)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    cubelm::perf::run_benchmarks(env.world_rank(), argc, argv);
  }
  return 0;
}
