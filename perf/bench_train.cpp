// Single-process speed: sgemm through cubelm's Kokkos Kernels wrapper against
// OpenBLAS called directly, and one full training step (forward, backward,
// AdamW) for two model sizes. Run at one thread, e.g.
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=true build/cpu/perf/bench_train
// Counters: GFLOP/s (2 n^3 per gemm; model FLOPs 6 N + 12 L H T per token for
// a step) and tok/s. Compare a step's GFLOP/s with the 1024^3 sgemm rate.

#include "cubelm/core/environment.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/model/shape.hpp"
#include "cubelm/train/trainer.hpp"

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <string>
#include <vector>

namespace {

void BM_GemmKokkosKernels(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  cubelm::kernels::Mat<float> a("a", n, n), b("b", n, n), c("c", n, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  const cubelm::ExecSpace exec;
  for (auto _ : state) {
    cubelm::kernels::gemm<float>(exec, false, false, 1.0f, a, b, 0.0f, c);
    exec.fence();
  }
  const double flops = 2.0 * n * n * static_cast<double>(n);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemmOpenBLAS(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  for (auto _ : state)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * static_cast<double>(n) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

std::string deck_text(int layers, int hidden, int heads, int seq, int vocab, int batch) {
  return "[model]\nvocab_size = " + std::to_string(vocab) + "\nseq_len = " + std::to_string(seq) +
         "\nhidden = " + std::to_string(hidden) + "\nheads = " + std::to_string(heads) +
         "\nlayers = " + std::to_string(layers) +
         "\n[train]\nglobal_batch = " + std::to_string(batch) +
         "\nsteps = 1000\n[data]\nsynthetic_tokens = 200000\n" + "[log]\npeak_gflops = 1.0\n";
}

void train_step(benchmark::State& state, const std::string& text) {
  const cubelm::Deck deck = cubelm::io::parse_deck(text, "bench");
  cubelm::train::Trainer trainer(deck);
  trainer.step(); // warm-up: first-touch of every buffer
  for (auto _ : state)
    trainer.step();
  const double tokens = static_cast<double>(deck.train.global_batch) * deck.model.seq_len;
  const double flops = cubelm::model::flops_per_token(deck.model) * tokens;
  state.counters["tok/s"] =
      benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params_M"] = cubelm::model::parameter_count(deck.model) / 1e6;
}

// small: L=4, H=256, a=8, T=256, V=8192, B=8; tiny: L=2, H=64, a=4, T=64, V=256, B=8.
void BM_TrainStepSmall(benchmark::State& state) {
  train_step(state, deck_text(4, 256, 8, 256, 8192, 8));
}
void BM_TrainStepTiny(benchmark::State& state) {
  train_step(state, deck_text(2, 64, 4, 64, 256, 8));
}

BENCHMARK(BM_GemmKokkosKernels)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmOpenBLAS)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepTiny)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_TrainStepSmall)->Unit(benchmark::kMillisecond)->MinTime(5.0);

} // namespace

int main(int argc, char** argv) {
  cubelm::Environment env(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
