// Single-process speed: sgemm through cubelm's Kokkos Kernels wrapper against
// OpenBLAS called directly, and one full training step (forward, backward,
// AdamW) for two model sizes. Run at one thread, e.g.
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=true build/cpu/perf/bench_train
// Counters: GFLOP/s (2 n^3 per gemm; model FLOPs 6 N + 12 L H T per token for
// a step) and tok/s. Compare a step's GFLOP/s with the 1024^3 sgemm rate: the small
// step's row does, with sgemm_GFLOP/s and of_sgemm from sgemms run between its steps.
// Every rate is per wall-clock second.
//
// GPT-2 124M rows (BM_TrainStepGPT2/fp32, /tf32, /bf16: L=12, H=768, a=12, T=1024,
// V=50257 padded to 50304, train.precision as named) time the same step at GPU
// scale, in wall-clock time, after two untimed steps. They are registered only
// where they are wanted: by default in a build whose Kokkos execution space is a
// device (CUDA), never by default in a CPU build (a step takes minutes there);
// CUBELM_BENCH_GPT2=1 (or --gpt2) registers them anywhere, CUBELM_BENCH_GPT2=0
// nowhere. Their settings:
//   --gpt2-batch=B or CUBELM_BENCH_GPT2_BATCH=B     sequences per step (default 8)
//   --gpt2-steps=S or CUBELM_BENCH_GPT2_STEPS=S     timed steps (default 5)
//   --peak-tflops=P                                 peak for MFU, every precision
//   CUBELM_BENCH_PEAK_TFLOPS_{FP32,TF32,BF16}=P     peak for MFU by precision
// Counters: tok/s, GFLOP/s (the model FLOPs above), params_M, batch, and MFU (the
// GFLOP/s over the peak, a fraction) when a peak is given. perf/torch_gpt2.py
// times PyTorch on the same model and FLOP count (docs/perf-runs.md), e.g.
//   build/cuda/perf/bench_train --benchmark_filter=GPT2 --peak-tflops=989

#include "cubelm/core/environment.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/train/trainer.hpp"

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
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

// tok/s, GFLOP/s (model FLOPs) and params_M of one training step per iteration;
// returns the step's model FLOPs.
double step_counters(benchmark::State& state, const cubelm::Deck& deck) {
  const double tokens = static_cast<double>(deck.train.global_batch) * deck.model.seq_len;
  const double flops = cubelm::cost::flops_per_token(deck.model) * tokens;
  state.counters["tok/s"] =
      benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params_M"] = cubelm::cost::parameter_count(deck.model) / 1e6;
  return flops;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One training step per iteration. With `interleaved_sgemm`, three sgemm 1024^3 run
// after each step, outside the step's time: the counters sgemm_GFLOP/s (their rate) and
// of_sgemm (the step's model FLOP rate over it) then compare the step with the gemm
// rate of the same seconds, which a machine whose speed drifts from minute to minute
// (a shared virtual machine) does not give two separate benchmarks.
void train_step(benchmark::State& state, const std::string& text, bool interleaved_sgemm) {
  const cubelm::Deck deck = cubelm::cost::parse_deck(text, "bench");
  cubelm::train::Trainer trainer(deck);
  trainer.step(); // warm-up: first-touch of every buffer
  constexpr int n = 1024, calls = 3;
  std::vector<float> a, b, c;
  if (interleaved_sgemm) {
    a.assign(static_cast<std::size_t>(n) * n, 0.5f);
    b.assign(a.size(), 0.25f);
    c.assign(a.size(), 0.0f);
  }
  double step_s = 0, gemm_s = 0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    trainer.step();
    step_s += seconds_since(start);
    if (interleaved_sgemm) {
      state.PauseTiming();
      const Clock::time_point g = Clock::now();
      for (int i = 0; i < calls; ++i)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                    n, 0.0f, c.data(), n);
      gemm_s += seconds_since(g);
      state.ResumeTiming();
    }
  }
  const double flops = step_counters(state, deck);
  if (interleaved_sgemm && gemm_s > 0 && step_s > 0) {
    const double steps = static_cast<double>(state.iterations());
    const double sgemm = steps * calls * 2.0 * n * n * static_cast<double>(n) / gemm_s;
    state.counters["sgemm_GFLOP/s"] = sgemm * 1e-9;
    state.counters["of_sgemm"] = steps * flops / step_s / sgemm;
  }
}

// small: L=4, H=256, a=8, T=256, V=8192, B=8; tiny: L=2, H=64, a=4, T=64, V=256, B=8.
void BM_TrainStepSmall(benchmark::State& state) {
  train_step(state, deck_text(4, 256, 8, 256, 8192, 8), true);
}
void BM_TrainStepTiny(benchmark::State& state) {
  train_step(state, deck_text(2, 64, 4, 64, 256, 8), false);
}

// The products of one small-model step alone, with the shapes, transpositions and
// accumulations the model's layers use (forward, weight gradient, input gradient of
// each linear layer and of the tied LM head; attention's batched products aside):
// the rate a step would reach if nothing but these products took time. Its GFLOP/s
// counts the same model FLOPs as BM_TrainStepSmall, so the step's rate over this one
// is the share of the step the rest (attention, elementwise kernels, AdamW) leaves.
void BM_GemmsOfSmallStep(benchmark::State& state) {
  const int layers = 4, n = 8 * 256, h = 256, f = 4 * h, vocab = 8192;
  using M = cubelm::kernels::Mat<float>;
  struct Linear {
    M x, w, y, dw, dx;
  };
  const auto mat = [](const char* label, int r, int c) {
    M m(std::string(label), r, c);
    Kokkos::deep_copy(m, 0.01f);
    return m;
  };
  std::vector<Linear> linears;
  const auto add = [&](int in, int out) {
    linears.push_back({mat("x", n, in), mat("w", in, out), mat("y", n, out), mat("dw", in, out),
                       mat("dx", n, in)});
  };
  for (int l = 0; l < layers; ++l) {
    for (int i = 0; i < 4; ++i) // q, k, v, projection
      add(h, h);
    add(h, f);
    add(f, h);
  }
  const M hid = mat("h", n, h), wte = mat("wte", vocab, h), logits = mat("logits", n, vocab),
          dwte = mat("dwte", vocab, h), dh = mat("dh", n, h);
  const cubelm::ExecSpace exec;
  namespace k = cubelm::kernels;
  for (auto _ : state) {
    for (const Linear& y : linears)
      k::gemm<float>(exec, false, false, 1.0f, y.x, y.w, 0.0f, y.y);
    k::gemm<float>(exec, false, true, 1.0f, hid, wte, 0.0f, logits);
    k::gemm<float>(exec, true, false, 1.0f, logits, hid, 1.0f, dwte);
    k::gemm<float>(exec, false, false, 1.0f, logits, wte, 0.0f, dh);
    for (const Linear& y : linears) {
      k::gemm<float>(exec, true, false, 1.0f, y.x, y.y, 1.0f, y.dw);
      k::gemm<float>(exec, false, true, 1.0f, y.y, y.w, 0.0f, y.dx);
    }
    exec.fence();
  }
  step_counters(state, cubelm::cost::parse_deck(deck_text(4, 256, 8, 256, 8192, 8), "bench"));
}

// GPT-2 124M at GPU scale (the header says when these rows exist).
struct Gpt2Options {
  bool enabled = !std::is_same<cubelm::ExecSpace::memory_space, Kokkos::HostSpace>::value;
  int batch = 8;
  int steps = 5;
  double peak_tflops = 0;           // --peak-tflops: every precision
  double peak_by_precision[3] = {}; // CUBELM_BENCH_PEAK_TFLOPS_{FP32,TF32,BF16}
};
Gpt2Options g_gpt2;

const char* const kPrecisions[3] = {"fp32", "tf32", "bf16"};

int positive_env(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : fallback;
}

void BM_TrainStepGPT2(benchmark::State& state, int precision) {
  const Gpt2Options& o = g_gpt2;
  const std::string text =
      "[model]\nvocab_size = 50257\nseq_len = 1024\nhidden = 768\nheads = 12\nlayers = 12\n"
      "[train]\nglobal_batch = " +
      std::to_string(o.batch) + "\nsteps = 1000\nprecision = \"" + kPrecisions[precision] +
      "\"\n[data]\nsynthetic_tokens = 200000\n[log]\npeak_gflops = 1.0\n";
  const cubelm::Deck deck = cubelm::cost::parse_deck(text, "bench");
  cubelm::train::Trainer trainer(deck);
  trainer.step(); // warm-up: allocations, library handles, first touch
  trainer.step();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    trainer.step();
    Kokkos::fence(); // every kernel of the step done inside the timed loop
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double flops = step_counters(state, deck);
  state.counters["batch"] = o.batch;
  const double peak = o.peak_tflops > 0 ? o.peak_tflops : o.peak_by_precision[precision];
  if (peak > 0 && seconds > 0) // a fraction, not a rate: the loop's own wall-clock time
    state.counters["MFU"] =
        flops * static_cast<double>(state.iterations()) / seconds / (peak * 1e12);
}

// Reads the GPT-2 settings from the environment and from argv (removing the flags
// that are ours), and registers the rows when they are enabled.
void gpt2_setup(int& argc, char** argv) {
  Gpt2Options& o = g_gpt2;
  if (const char* v = std::getenv("CUBELM_BENCH_GPT2"))
    o.enabled = std::strcmp(v, "0") != 0 && *v != '\0';
  o.batch = positive_env("CUBELM_BENCH_GPT2_BATCH", o.batch);
  o.steps = positive_env("CUBELM_BENCH_GPT2_STEPS", o.steps);
  const char* names[3] = {"CUBELM_BENCH_PEAK_TFLOPS_FP32", "CUBELM_BENCH_PEAK_TFLOPS_TF32",
                          "CUBELM_BENCH_PEAK_TFLOPS_BF16"};
  for (int p = 0; p < 3; ++p)
    if (const char* v = std::getenv(names[p]))
      o.peak_by_precision[p] = std::max(0.0, std::atof(v));
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--gpt2") == 0)
      o.enabled = true;
    else if (std::strncmp(a, "--gpt2-batch=", 13) == 0)
      o.batch = std::max(1, std::atoi(a + 13));
    else if (std::strncmp(a, "--gpt2-steps=", 13) == 0)
      o.steps = std::max(1, std::atoi(a + 13));
    else if (std::strncmp(a, "--peak-tflops=", 14) == 0)
      o.peak_tflops = std::max(0.0, std::atof(a + 14));
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  argv[argc] = nullptr;
  if (!o.enabled)
    return;
  for (int p = 0; p < 3; ++p)
    benchmark::RegisterBenchmark((std::string("BM_TrainStepGPT2/") + kPrecisions[p]).c_str(),
                                 BM_TrainStepGPT2, p)
        ->Iterations(o.steps)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
}

// Wall-clock time for every rate: the kernels run on OpenMP threads, and the CPU time
// Google Benchmark measures by default is the calling thread's alone.
BENCHMARK(BM_GemmKokkosKernels)->Arg(256)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmOpenBLAS)->Arg(256)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepTiny)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_TrainStepSmall)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(5.0);
BENCHMARK(BM_GemmsOfSmallStep)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

} // namespace

int main(int argc, char** argv) {
  // The BLAS kernels that fit the processor, as cubelm itself runs (kernels/blas.hpp).
  const auto kernels = cubelm::kernels::ensure_blas_kernels(argv);
  cubelm::Environment env(argc, argv);
  gpt2_setup(argc, argv);
  benchmark::AddCustomContext("blas", cubelm::kernels::blas_threading() + ", " + kernels.note);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
