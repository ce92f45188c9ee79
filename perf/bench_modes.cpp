// The tensor-parallel modes side by side: one training step of the same model
// under every mode the world size fits (1D always, 2D on a square, 3D on a cube).
//   OMP_NUM_THREADS=1 mpiexec -n 8 build/cpu/perf/bench_modes
// Every rank runs the same fixed number of steps (collectives cannot run an
// adaptive count); rank 0 reports. Counters per rank and step: bytes sent
// (modelled, docs/communication.md), memory (parameters + gradients + AdamW +
// activations, as allocated) and parameter memory. Model: CUBELM_BENCH_MODEL =
// "small" (default: L2 H256 a8 T128 V1024, 16 sequences per step) or "medium"
// (L4 H512 a8 T256 V4096, 16 sequences).
#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/environment.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/train/trainer.hpp"

#include "bench_mpi.hpp"

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kSteps = 5;

std::string model_section() {
  const char* env = std::getenv("CUBELM_BENCH_MODEL");
  const std::string which = env != nullptr ? env : "small";
  if (which == "medium")
    return "vocab_size = 4096\nseq_len = 256\nhidden = 512\nheads = 8\nlayers = 4\n";
  return "vocab_size = 1024\nseq_len = 128\nhidden = 256\nheads = 8\nlayers = 2\n";
}

cubelm::Deck deck(const char* mode, int tp) {
  const std::string text = "[model]\n" + model_section() + "[parallel]\ntensor_mode = \"" + mode +
                           "\"\ntensor_size = " + std::to_string(tp) +
                           "\n[train]\nsteps = 1000\nglobal_batch = 16\nseed = 1\n"
                           "[data]\nsynthetic_tokens = 200000\n[log]\npeak_gflops = 1.0\n";
  return cubelm::cost::parse_deck(text, "bench_modes");
}

void BM_TrainStep(benchmark::State& state, const char* mode) {
  const int world = cubelm::comm::Communicator::world().size();
  cubelm::train::Trainer trainer(deck(mode, world));
  trainer.step(); // warm-up: first-touch of buffers, MPI connections
  double bytes = 0, tokens = 0;
  for (auto _ : state) {
    const auto m = trainer.step();
    bytes += m.comm_bytes;
    tokens += 16.0 * trainer.model().config().seq_len;
  }
  const auto mem = trainer.memory();
  state.counters["ranks"] = world;
  state.counters["bytes/rank/step"] = bytes / static_cast<double>(state.iterations());
  state.counters["MiB/rank"] = static_cast<double>(mem.total()) / 1048576.0;
  state.counters["param_MiB/rank"] = static_cast<double>(mem.parameters) / 1048576.0;
  state.counters["tok/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
}

bool is_power(int n, int exp) {
  for (int q = 1;; ++q) {
    int v = 1;
    for (int i = 0; i < exp; ++i)
      v *= q;
    if (v == n)
      return true;
    if (v > n)
      return false;
  }
}

} // namespace

int main(int argc, char** argv) {
  cubelm::kernels::ensure_blas_kernels(argv); // the kernels cubelm runs (kernels/blas.hpp)
  cubelm::Environment env(argc, argv);
  {
    const int world = cubelm::comm::Communicator::world().size();
    auto reg = [](const char* name, const char* mode) {
      benchmark::RegisterBenchmark(name, BM_TrainStep, mode)
          ->Iterations(kSteps)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    };
    reg(world == 1 ? "train_step/none" : "train_step/1d", world == 1 ? "none" : "1d");
    if (world > 1 && is_power(world, 2))
      reg("train_step/2d", "2d");
    if (world > 1 && is_power(world, 3))
      reg("train_step/3d", "3d");
    cubelm::perf::run_benchmarks(env.world_rank(), argc, argv);
  }
  return 0;
}
