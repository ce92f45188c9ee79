// One benchmark per kernel family at GPT-2 124M shapes (H = 768, 12 heads, T = 1024,
// V = 50304), so that a run says how close each kernel is to its roofline:
// memory-bound kernels report GB/s (the bytes they must move at the least: every
// input read once, every output written once), products report GFLOP/s. Compare
// the GB/s with the device's memory bandwidth (a STREAM-like copy is included as
// the practical ceiling) and the GFLOP/s with the sgemm rows.
//
//   OMP_NUM_THREADS=1 build/cpu/perf/bench_kernels              (B = 1 sequence)
//   build/cuda/perf/bench_kernels --batch=8                      (B = 8, a GPU run)
//
// --batch=B sets the sequences per micro-batch (N = B x 1024 rows).

#include "cubelm/core/environment.hpp"
#include "cubelm/kernels/attention.hpp"
#include "cubelm/kernels/attention_blocks.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "cubelm/kernels/layernorm.hpp"
#include "cubelm/kernels/loss.hpp"
#include "cubelm/kernels/optim.hpp"
#include "cubelm/tp/attention.hpp"

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using cubelm::ExecSpace;
using cubelm::MemSpace;
namespace k = cubelm::kernels;
using Mat = k::Mat<float>;
using Vec = k::Vec<float>;

// GPT-2 124M.
constexpr int kHidden = 768;
constexpr int kHeads = 12;
constexpr int kSeq = 1024;
constexpr int kVocab = 50304;
int g_batch = 1;

std::int64_t rows() {
  return static_cast<std::int64_t>(g_batch) * kSeq;
}

template <class T = float>
k::Mat<T> filled(const char* name, std::int64_t r, std::int64_t c, float scale = 1.0f) {
  k::Mat<T> m(std::string(name), r, c);
  // One thread per element, neighbouring threads on neighbouring columns.
  Kokkos::parallel_for(
      "bench_fill", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(0, r * c),
      KOKKOS_LAMBDA(const std::int64_t e) {
        const std::int64_t i = e / c, j = e % c;
        // A cheap deterministic pattern in [-scale, scale].
        const std::uint32_t h = static_cast<std::uint32_t>(i * 2654435761u + j * 40503u);
        m(i, j) = scale * (static_cast<float>(h % 2001u) / 1000.0f - 1.0f);
      });
  return m;
}

Vec filled_vec(const char* name, std::int64_t n, float value) {
  Vec v(std::string(name), n);
  Kokkos::deep_copy(v, value);
  return v;
}

k::Tokens tokens(std::int64_t n, int vocab) {
  k::Tokens t("tokens", n);
  Kokkos::parallel_for(
      "bench_tokens", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) {
        t(i) = static_cast<std::int32_t>((i * 7919) % vocab);
      });
  return t;
}

void bytes(benchmark::State& state, double per_iteration) {
  state.counters["GB/s"] =
      benchmark::Counter(per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void flops(benchmark::State& state, double per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------- ceilings --

void BM_Copy(benchmark::State& state) {
  const Mat a = filled("a", rows(), 4 * kHidden), b("b", rows(), 4 * kHidden);
  const ExecSpace exec;
  for (auto _ : state) {
    Kokkos::deep_copy(exec, b, a);
    exec.fence();
  }
  bytes(state, 2.0 * 4 * a.size());
}

// The four products of a layer and the LM head, forward shapes.
void BM_Gemm(benchmark::State& state) {
  const std::int64_t in = state.range(0), out = state.range(1);
  const Mat x = filled("x", rows(), in), w = filled("w", in, out, 0.02f), y("y", rows(), out);
  const ExecSpace exec;
  for (auto _ : state) {
    k::gemm<float>(exec, false, false, 1.0f, x, w, 0.0f, y);
    exec.fence();
  }
  flops(state, 2.0 * rows() * in * out);
}

// A small product (Args: rows, k, n) on float or on bf16 storage (bf16 activations and
// weights, bf16 result: on CPUs sgemm on float copies of the inputs, the result rounded
// back), so that the two rates side by side show what the conversions cost.
template <class T>
void BM_GemmSmall(benchmark::State& state) {
  const std::int64_t m = state.range(0), kk = state.range(1), n = state.range(2);
  const k::Mat<T> x("x", m, kk), w("w", kk, n), y("y", m, n);
  Kokkos::deep_copy(x, 0.5f);
  Kokkos::deep_copy(w, 0.01f);
  const ExecSpace exec;
  for (auto _ : state) {
    k::gemm<T>(exec, false, false, 1.0f, x, w, 0.0f, y);
    exec.fence();
  }
  flops(state, 2.0 * m * kk * n);
}

// ------------------------------------------------------------ row kernels --

void BM_LayerNormForward(benchmark::State& state) {
  const Mat x = filled("x", rows(), kHidden), y("y", rows(), kHidden);
  const Vec g = filled_vec("g", kHidden, 1.0f), b = filled_vec("b", kHidden, 0.0f);
  const Vec mean("mean", rows()), rstd("rstd", rows());
  const ExecSpace exec;
  for (auto _ : state) {
    k::layernorm_forward<float>(exec, x, g, b, y, mean, rstd);
    exec.fence();
  }
  bytes(state, 4.0 * (2.0 * x.size() + 2.0 * rows()));
}

void BM_LayerNormBackward(benchmark::State& state) {
  const Mat x = filled("x", rows(), kHidden), dy = filled("dy", rows(), kHidden),
            dx("dx", rows(), kHidden);
  const Vec g = filled_vec("g", kHidden, 1.0f), b = filled_vec("b", kHidden, 0.0f);
  const Vec mean("mean", rows()), rstd("rstd", rows()), dg("dg", kHidden), db("db", kHidden);
  const Mat y("y", rows(), kHidden);
  const ExecSpace exec;
  k::layernorm_forward<float>(exec, x, g, b, y, mean, rstd);
  for (auto _ : state) {
    k::layernorm_backward<float>(exec, dy, x, g, mean, rstd, dx, dg, db);
    exec.fence();
  }
  // reads x, dy, dx (accumulated), writes dx
  bytes(state, 4.0 * 4.0 * x.size());
}

// Cross-entropy over the whole vocabulary, loss and gradient: reads the logits, writes
// the gradient. Argument 1: one kernel per row (whole_vocab_cross_entropy, what a rank
// holding the whole vocabulary runs); 0: the three vocabulary-parallel steps on one
// slice (what a rank holding a slice runs, without the all-reduces).
template <class T>
void BM_CrossEntropy(benchmark::State& state) {
  const k::Mat<T> logits = filled<T>("logits", rows(), kVocab, 4.0f);
  const k::Mat<T> work("work", rows(), kVocab);
  const k::Tokens targets = tokens(rows(), kVocab);
  const Vec mx("mx", rows()), losses("losses", rows());
  const Mat stats("stats", rows(), 2);
  const ExecSpace exec;
  for (auto _ : state) {
    state.PauseTiming();
    Kokkos::deep_copy(exec, work, logits);
    exec.fence();
    state.ResumeTiming();
    if (state.range(0) != 0) {
      k::whole_vocab_cross_entropy<T>(exec, work, targets, kVocab, losses, 1.0f / rows());
    } else {
      k::row_max<T>(exec, work, kVocab, mx);
      k::row_sumexp_target<T>(exec, work, mx, targets, 0, kVocab, stats);
      k::vocab_cross_entropy<T>(exec, work, stats, targets, 0, kVocab, losses, 1.0f / rows());
    }
    exec.fence();
  }
  bytes(state, sizeof(T) * 2.0 * logits.size());
}

// ------------------------------------------------------- column reductions --

void BM_BiasBackward(benchmark::State& state) {
  const std::int64_t cols = state.range(0);
  const Mat dy = filled("dy", rows(), cols);
  const Vec db("db", cols);
  const ExecSpace exec;
  for (auto _ : state) {
    k::bias_backward<float>(exec, dy, db);
    exec.fence();
  }
  bytes(state, 4.0 * dy.size());
}

// ------------------------------------------------------------ elementwise --

// Stored as T (float, or bf16 as under train.precision = "bf16"), computed in float.
template <class T>
void BM_GeluForward(benchmark::State& state) {
  const k::Mat<T> x = filled<T>("x", rows(), 4 * kHidden), y("y", rows(), 4 * kHidden),
                  th("th", rows(), 4 * kHidden);
  const ExecSpace exec;
  for (auto _ : state) {
    k::gelu_forward<T>(exec, x, y, th);
    exec.fence();
  }
  bytes(state, sizeof(T) * 3.0 * x.size());
}

template <class T>
void BM_GeluBackward(benchmark::State& state) {
  const k::Mat<T> x = filled<T>("x", rows(), 4 * kHidden),
                  th = filled<T>("th", rows(), 4 * kHidden),
                  dy = filled<T>("dy", rows(), 4 * kHidden), dx("dx", rows(), 4 * kHidden);
  const ExecSpace exec;
  for (auto _ : state) {
    k::gelu_backward<T>(exec, x, th, dy, dx);
    exec.fence();
  }
  bytes(state, sizeof(T) * 4.0 * x.size());
}

template <class T>
void BM_BiasAdd(benchmark::State& state) {
  const k::Mat<T> y = filled<T>("y", rows(), 4 * kHidden);
  const k::Vec<T> b("b", 4 * kHidden);
  const ExecSpace exec;
  for (auto _ : state) {
    k::bias_add<T>(exec, y, b);
    exec.fence();
  }
  bytes(state, sizeof(T) * 2.0 * y.size());
}

// -------------------------------------------------------------- attention --

// Causal attention of B sequences x 12 heads; GFLOP/s counts the four (forward)
// or ten (backward: recomputed head copies aside) T x T x d products in full,
// masked half included, as the GPT-2 FLOP count does.
// Arg 1: by (sequence, head) pair on CPUs (the default); 0: the separate passes.
void BM_AttentionForward(benchmark::State& state) {
  k::set_attention_by_pair(state.range(0) != 0);
  const int d = kHidden / kHeads;
  const Mat q = filled("q", rows(), kHidden), kk = filled("k", rows(), kHidden),
            v = filled("v", rows(), kHidden), out("out", rows(), kHidden);
  const k::Tensor4<float> probs("probs", g_batch, kHeads, kSeq, kSeq);
  const k::AttentionWorkspace<float> work(g_batch, kHeads, kSeq, d);
  const ExecSpace exec;
  for (auto _ : state) {
    k::attention_forward<float>(exec, q, kk, v, kHeads, probs, work, out);
    exec.fence();
  }
  flops(state, 4.0 * g_batch * kHeads * static_cast<double>(kSeq) * kSeq * d);
}

void BM_AttentionBackward(benchmark::State& state) {
  k::set_attention_by_pair(state.range(0) != 0);
  const int d = kHidden / kHeads;
  const Mat q = filled("q", rows(), kHidden), kk = filled("k", rows(), kHidden),
            v = filled("v", rows(), kHidden), out("out", rows(), kHidden),
            dout = filled("dout", rows(), kHidden), dq("dq", rows(), kHidden),
            dk("dk", rows(), kHidden), dv("dv", rows(), kHidden);
  const k::Tensor4<float> probs("probs", g_batch, kHeads, kSeq, kSeq),
      scratch("scratch", g_batch, kHeads, kSeq, kSeq);
  const k::AttentionWorkspace<float> work(g_batch, kHeads, kSeq, d);
  const ExecSpace exec;
  k::attention_forward<float>(exec, q, kk, v, kHeads, probs, work, out);
  for (auto _ : state) {
    k::attention_backward<float>(exec, q, kk, v, kHeads, probs, dout, scratch, work, dq, dk, dv);
    exec.fence();
  }
  flops(state, 8.0 * g_batch * kHeads * static_cast<double>(kSeq) * kSeq * d);
}

// The model's attention (tp::BlockAttention on one rank: blocks of 128 tokens, partial
// results merged by their log-sum-exp, probabilities recomputed in the backward), with
// the FLOPs counted as above, so that its rate compares with the stored attention's.
void BM_BlockAttentionForward(benchmark::State& state) {
  const int d = kHidden / kHeads;
  const Mat q = filled("q", rows(), kHidden), kk = filled("k", rows(), kHidden),
            v = filled("v", rows(), kHidden), out("out", rows(), kHidden);
  const cubelm::tp::BlockAttention<float> attention(nullptr, g_batch, kHeads, kSeq, d);
  const k::Batch<float> saved = attention.make_saved();
  const ExecSpace exec;
  for (auto _ : state) {
    attention.forward(exec, q, kk, v, saved, out);
    exec.fence();
  }
  flops(state, 4.0 * g_batch * kHeads * static_cast<double>(kSeq) * kSeq * d);
}

void BM_BlockAttentionBackward(benchmark::State& state) {
  const int d = kHidden / kHeads;
  const Mat q = filled("q", rows(), kHidden), kk = filled("k", rows(), kHidden),
            v = filled("v", rows(), kHidden), out("out", rows(), kHidden),
            dout = filled("dout", rows(), kHidden), dq("dq", rows(), kHidden),
            dk("dk", rows(), kHidden), dv("dv", rows(), kHidden);
  const cubelm::tp::BlockAttention<float> attention(nullptr, g_batch, kHeads, kSeq, d);
  const k::Batch<float> saved = attention.make_saved();
  const ExecSpace exec;
  attention.forward(exec, q, kk, v, saved, out);
  for (auto _ : state) {
    attention.backward(exec, q, kk, v, out, saved, dout, dq, dk, dv);
    exec.fence();
  }
  flops(state, 8.0 * g_batch * kHeads * static_cast<double>(kSeq) * kSeq * d);
}

// The block attention's copies between the [N, H] matrices and its blocks
// [B * heads, 128, d] (every position of the sequence, a block at a time): GPT-2's
// heads (d = 64) and twice as many (d = 32, the head size of the small model).
void BM_GatherHeads(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0)), d = kHidden / heads, len = 128;
  const Mat x = filled("x", rows(), kHidden);
  const k::Batch<float> block("block", g_batch * heads, len, d);
  const ExecSpace exec;
  for (auto _ : state) {
    for (std::int64_t t = 0; t < kSeq; t += len)
      k::gather_heads<float>(exec, x, heads, t, block);
    exec.fence();
  }
  bytes(state, 2.0 * 4 * x.size());
}

void BM_ScatterHeads(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0)), d = kHidden / heads, len = 128;
  const Mat x("x", rows(), kHidden);
  const k::Batch<float> block("block", g_batch * heads, len, d);
  Kokkos::deep_copy(block, 0.5f);
  const ExecSpace exec;
  for (auto _ : state) {
    for (std::int64_t t = 0; t < kSeq; t += len)
      k::scatter_heads<float>(exec, block, heads, t, x, state.range(1) != 0);
    exec.fence();
  }
  bytes(state, (state.range(1) != 0 ? 3.0 : 2.0) * 4 * x.size());
}

// -------------------------------------------------------------- embedding --

void BM_EmbeddingForward(benchmark::State& state) {
  const Mat wte = filled("wte", kVocab, kHidden, 0.02f), wpe = filled("wpe", kSeq, kHidden, 0.02f),
            y("y", rows(), kHidden);
  const k::Tokens tok = tokens(rows(), kVocab);
  const ExecSpace exec;
  for (auto _ : state) {
    k::embedding_forward<float>(exec, tok, wte, wpe, kSeq, y);
    exec.fence();
  }
  bytes(state, 4.0 * 3.0 * y.size());
}

// The token gradient (index build included) and the position gradient.
void BM_EmbeddingBackward(benchmark::State& state) {
  const Mat dy = filled("dy", rows(), kHidden), dwte("dwte", kVocab, kHidden),
            dwpe("dwpe", kSeq, kHidden);
  const k::Tokens tok = tokens(rows(), kVocab);
  k::TokenIndexer indexer;
  const ExecSpace exec;
  for (auto _ : state) {
    const k::TokenIndex& index = indexer.build(exec, tok, 0, kVocab);
    k::embedding_backward<float>(exec, index, dy, kSeq, dwte, dwpe);
    exec.fence();
  }
  // reads dy twice (tokens, positions); reads and writes dwte and dwpe
  bytes(state, 4.0 * (2.0 * dy.size() + 2.0 * dwte.size() + 2.0 * dwpe.size()));
}

// -------------------------------------------------------------- optimizer --

// Norm, then clip + AdamW over the 124M parameters as one flat buffer.
void BM_Optimizer(benchmark::State& state) {
  const std::int64_t n = 124475904; // GPT-2 124M with V = 50304
  const Vec p = filled_vec("p", n, 0.01f), g = filled_vec("g", n, 0.001f), m("m", n), v("v", n);
  std::vector<k::OptimChunk> table;
  for (std::int64_t at = 0; at < n; at += k::kOptimChunk)
    table.push_back({at, at, std::min(k::kOptimChunk, n - at), true, true});
  Kokkos::View<k::OptimChunk*, MemSpace> chunks("chunks", table.size());
  Kokkos::deep_copy(
      chunks, Kokkos::View<const k::OptimChunk*, Kokkos::HostSpace,
                           Kokkos::MemoryTraits<Kokkos::Unmanaged>>(table.data(), table.size()));
  const ExecSpace exec;
  k::AdamW hp;
  hp.lr = 1e-4;
  hp.weight_decay = 0.1;
  for (auto _ : state) {
    const double norm2 = k::sum_squares<float>(exec, chunks, g);
    k::adamw_update<float>(exec, hp, static_cast<float>(1.0 / (1.0 + norm2)), chunks, p, g, m, v);
    exec.fence();
  }
  // norm: reads g; update: reads p, g, m, v, writes p, m, v
  bytes(state, 4.0 * 8.0 * n);
}

// Wall-clock time for every rate: the kernels run on OpenMP threads, and the CPU time
// Google Benchmark measures by default is the calling thread's alone.
BENCHMARK(BM_Copy)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemm)
    ->Args({kHidden, 3 * kHidden})
    ->Args({kHidden, 4 * kHidden})
    ->Args({4 * kHidden, kHidden})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// The quick-start model's products (1024 rows, hidden 64): where conversions weigh most.
BENCHMARK_TEMPLATE(BM_GemmSmall, float)
    ->Args({1024, 64, 256})
    ->Args({1024, 256, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_GemmSmall, cubelm::bf16)
    ->Args({1024, 64, 256})
    ->Args({1024, 256, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerNormForward)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LayerNormBackward)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_CrossEntropy, float)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_CrossEntropy, cubelm::bf16)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BiasBackward)
    ->Arg(kHidden)
    ->Arg(4 * kHidden)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_BiasAdd, float)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_BiasAdd, cubelm::bf16)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_GeluForward, float)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_GeluForward, cubelm::bf16)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_GeluBackward, float)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_GeluBackward, cubelm::bf16)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionForward)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionBackward)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockAttentionForward)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockAttentionBackward)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GatherHeads)
    ->Arg(kHeads)
    ->Arg(2 * kHeads)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScatterHeads)
    ->Args({kHeads, 0})
    ->Args({kHeads, 1})
    ->Args({2 * kHeads, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EmbeddingForward)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EmbeddingBackward)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Optimizer)->UseRealTime()->Unit(benchmark::kMillisecond);

} // namespace

int main(int argc, char** argv) {
  // The BLAS kernels that fit the processor, as cubelm itself runs (kernels/blas.hpp).
  const auto kernels = cubelm::kernels::ensure_blas_kernels(argv);
  benchmark::AddCustomContext("blas", cubelm::kernels::blas_threading() + ", " + kernels.note);
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--batch=", 8) == 0)
      g_batch = std::max(1, std::atoi(argv[i] + 8));
    else
      args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  char** av = args.data();
  cubelm::Environment env(n, av);
  benchmark::Initialize(&n, av);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
