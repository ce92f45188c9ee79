// The planner's predicted step time against the measured one, for a spread of the
// layouts `cubelm plan` lists for a tiny model at this world size:
//   OMP_NUM_THREADS=1 mpiexec -n 4 build/cpu/perf/bench_planner
// The machine is calibrated first on these ranks (as `cubelm plan --calibrate`
// does), so the prediction uses this machine's gemm rate, memory bandwidth and
// all-reduce cost. One benchmark per layout (at most 12); counters: the predicted
// step in ms and predicted / measured. How far the planner is from the truth is a
// measurement, reported here, not a unit test's bound (docs/planner.md).
#include "cubelm/app/plan.hpp"
#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/environment.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/planner.hpp"
#include "cubelm/cost/predict.hpp"
#include "cubelm/io/machine.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/train/trainer.hpp"

#include "bench_mpi.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

// tests/decks/plan_tiny.toml's model, with enough work per step to time.
cubelm::Deck tiny() {
  return cubelm::cost::parse_deck(R"([model]
vocab_size = 32
seq_len = 32
hidden = 64
heads = 4
layers = 4
[train]
global_batch = 8
steps = 1000
[data]
synthetic_tokens = 50000
[log]
peak_gflops = 1.0
)",
                                  "bench_planner");
}

void BM_Layout(benchmark::State& state, const cubelm::Deck& deck,
               const cubelm::io::Machine& machine) {
  const cubelm::cost::Prediction p = cubelm::cost::predict(deck, machine);
  cubelm::train::Trainer trainer(deck);
  trainer.step(); // warm-up
  double seconds = 0;
  for (auto _ : state) {
    const auto m = trainer.step();
    state.SetIterationTime(m.ms / 1e3);
    seconds += m.ms / 1e3;
  }
  const double measured = seconds / static_cast<double>(state.iterations());
  state.counters["predicted_ms"] = p.step_s * 1e3;
  state.counters["predicted/measured"] = p.step_s / measured;
}

} // namespace

int main(int argc, char** argv) {
  cubelm::kernels::ensure_blas_kernels(argv); // the kernels cubelm runs (kernels/blas.hpp)
  cubelm::Environment env(argc, argv);
  {
    std::string report;
    const cubelm::io::Machine machine = cubelm::app::measure_machine("", report);
    const int world = cubelm::comm::Communicator::world().size();
    const std::vector<cubelm::Deck> all = cubelm::cost::layouts(tiny(), world);
    const std::size_t stride = std::max<std::size_t>(1, all.size() / 12);
    for (std::size_t i = 0; i < all.size(); i += stride)
      benchmark::RegisterBenchmark(cubelm::cost::layout_line(all[i]).c_str(), BM_Layout, all[i],
                                   machine)
          ->Iterations(5)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
    cubelm::perf::run_benchmarks(env.world_rank(), argc, argv);
  }
  return 0;
}
