// Checkpoint write and read rates against the file system's own, measured in the same run:
//   OMP_NUM_THREADS=1 mpiexec -n 8 build/cpu/perf/bench_checkpoint [--dir=DIR] [--iterations=N]
//
// Each benchmark builds the model of one layout (Trainer, with its AdamW moments), saves
// a checkpoint with Trainer::save (the training loop's own path: parallel HDF5, Fletcher32
// chunks, the .partial rename) and loads it back with Trainer::resume. Beside it, every
// rank writes its share of the same number of bytes to a file of its own with write(2)
// and fsync(2), reads it back, and writes it again with O_DIRECT: the raw rates of the same
// file system, same ranks; then the first rank writes all the bytes alone with O_DIRECT,
// the one stream that the one writer (checkpoint.writers = "one") writes.
// Before each read the file's pages are dropped from the page cache (fsync, then
// posix_fadvise DONTNEED), so that reads come from storage where the kernel allows it.
// Before each write the file of the previous one is removed (untimed): every save and raw
// write goes to a file that does not exist yet, as a run's saves do (step_N.h5; older
// ones are pruned after). Replacing a file costs its removal besides (0.2 s for 1.5 GB
// here, in the rename of the save; in the truncation of the raw write). The file system's
// dirty pages are then written back (syncfs), also untimed.
//
// Counters (rank 0; times are the slowest rank's, between barriers):
//   GB            the checkpoint file's size (10^9 bytes)
//   write_GB/s    checkpoint size / save time     raw_write_GB/s  the same bytes, write+fsync
//                                                 raw_direct_GB/s the same bytes, O_DIRECT
//                                                 raw_one_GB/s    the same, first rank alone
//   read_GB/s     checkpoint size / resume time   raw_read_GB/s   the same bytes, read
//   write_%raw    write_GB/s as a share of the faster raw write (read_%raw: of raw_read)
//
// checkpoint_async/<layout> measures what checkpoint.async saves the training loop, in
// the same run: a synchronous save (Trainer::save), a training step, then a background
// save (Trainer::save_in_background: the copy to host buffers and the writer's start),
// a step while the writer runs, and the wait for the rest of the write:
//   sync_s        the synchronous save       stall_s     the background save's stall
//   stall_%sync   stall_s as a share of sync_s (the target: at most 10%)
//   step_s        a step alone               step_during_write_s  a step beside the writer
//   write_s       the writer's time from start to commit
// MPI runs at MPI_THREAD_MULTIPLE (the writer thread talks to MPI), for both benchmarks.
//
// Model: CUBELM_BENCH_MODEL = "124m" (default: GPT-2 124M, L12 H768 T1024 V50257),
// "350m" (L24 H1024) or "small" (L2 H256 T128 V1024, for a quick look); 16 heads, so that
// 3D on 8 ranks splits them (heads do not change the parameters). One sequence per rank
// and step: the activations stay small. Layouts, as the world size fits: "none" on one
// rank; "1d" (tensor_size = ranks), "3d" on a cube, "zero" (data_size = ranks, zero = 1).
// --writers=all|one|both (default both): checkpoint.writers, "<layout>/one" for "one".
// DIR (default bench_checkpoint.tmp in the working directory) is created and emptied;
// N saves and loads per layout (default 2). File systems vary from one save to the next
// (write-back of the previous file, other jobs): compare rates measured side by side.
#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/environment.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/train/trainer.hpp"

#include "bench_mpi.hpp"

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using cubelm::comm::Communicator;

std::string g_dir = "bench_checkpoint.tmp";
int g_iterations = 2;
std::string g_writers = "both"; // checkpoint.writers: "all", "one" or "both" (each layout twice)

std::string model_section() {
  const char* env = std::getenv("CUBELM_BENCH_MODEL");
  const std::string which = env != nullptr ? env : "124m";
  if (which == "small")
    return "vocab_size = 1024\nseq_len = 128\nhidden = 256\nheads = 16\nlayers = 2\n";
  if (which == "350m")
    return "vocab_size = 50257\nseq_len = 1024\nhidden = 1024\nheads = 16\nlayers = 24\n";
  if (which != "124m")
    throw cubelm::Error("CUBELM_BENCH_MODEL = \"" + which +
                        "\": the models are \"124m\", \"350m\" and \"small\"");
  return "vocab_size = 50257\nseq_len = 1024\nhidden = 768\nheads = 16\nlayers = 12\n";
}

// `name` is a layout, with "/one" after it for checkpoint.writers = "one".
cubelm::Deck deck(const std::string& name, int world, bool async = false) {
  const std::size_t slash = name.find('/');
  const std::string layout = name.substr(0, slash);
  const std::string writers = slash == std::string::npos ? "all" : name.substr(slash + 1);
  std::string parallel;
  if (layout == "1d")
    parallel = "tensor_mode = \"1d\"\ntensor_size = " + std::to_string(world) + "\n";
  else if (layout == "3d")
    parallel = "tensor_mode = \"3d\"\ntensor_size = " + std::to_string(world) + "\n";
  else if (layout == "zero")
    parallel = "data_size = " + std::to_string(world) + "\nzero = 1\n";
  // One sequence per rank that needs whole sequences of its own: data-parallel ranks,
  // and 3D's q x q planes of a q x q x q cube.
  int batch = layout == "zero" ? world : 1;
  for (int q = 1; layout == "3d" && q * q * q <= world; ++q)
    batch = q * q;
  const std::string text = "[model]\n" + model_section() + "[parallel]\n" + parallel +
                           "[train]\nsteps = 1000\nglobal_batch = " + std::to_string(batch) +
                           "\nseed = 1\n[data]\nsynthetic_tokens = 200000\n"
                           "[checkpoint]\ndir = \"" +
                           g_dir + "\"\nasync = " + (async ? "true" : "false") + "\nwriters = \"" +
                           writers + "\"" + "\n[log]\npeak_gflops = 1.0\n";
  return cubelm::cost::parse_deck(text, "bench_checkpoint");
}

double now() {
  return MPI_Wtime();
}

// The slowest rank's time for `f`, all ranks starting together.
template <class F>
double timed(const Communicator& comm, F&& f) {
  MPI_Barrier(comm.raw());
  const double t0 = now();
  f();
  const double mine = now() - t0;
  double slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm.raw());
  return slowest;
}

[[noreturn]] void io_failed(const std::string& what, const std::string& path) {
  throw cubelm::Error("bench_checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

// Drops the file's pages from the page cache (after writing them back).
void drop_cached(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    io_failed("cannot open", path);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Writes `bytes` to `path` in 8 MiB pieces and syncs it to storage: through the page
// cache, or with `direct` bypassing it (O_DIRECT; the last piece rounded up to 4 KiB).
// False where the file system refuses O_DIRECT.
bool raw_write(const std::string& path, std::uint64_t bytes, bool direct = false) {
  constexpr std::size_t kPiece = std::size_t{8} << 20, kBlock = 4096;
  void* memory = nullptr;
  if (posix_memalign(&memory, kBlock, kPiece) != 0)
    throw std::bad_alloc();
  std::unique_ptr<char, decltype(&std::free)> piece(static_cast<char*>(memory), &std::free);
  std::memset(piece.get(), 'c', kPiece);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0 && direct)
    return false;
  if (fd < 0)
    io_failed("cannot create", path);
  for (std::uint64_t done = 0; done < bytes;) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, bytes - done));
    if (direct)
      n = (n + kBlock - 1) / kBlock * kBlock;
    const ssize_t w = ::pwrite(fd, piece.get(), n, static_cast<off_t>(done));
    if (w < 0 && direct && errno == EINVAL && done == 0) { // opened, but no direct writes
      ::close(fd);
      return false;
    }
    if (w <= 0)
      io_failed("cannot write", path);
    done += static_cast<std::uint64_t>(w);
  }
  if (::fsync(fd) != 0)
    io_failed("cannot sync", path);
  ::close(fd);
  return true;
}

void raw_read(const std::string& path) {
  std::vector<char> piece(std::size_t{8} << 20);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    io_failed("cannot open", path);
  while (true) {
    const ssize_t r = ::read(fd, piece.data(), piece.size());
    if (r < 0)
      io_failed("cannot read", path);
    if (r == 0)
      break;
  }
  ::close(fd);
}

// Before a write (see the top of this file): the previous iteration's file removed by the
// rank that wrote it, and the file system's dirty pages written back, so that no
// write-back of an earlier file (the MPI-IO save's, which goes through the page cache)
// competes with the write measured.
void remove_before_write(const Communicator& world, const std::string& file, bool mine) {
  std::error_code ec;
  if (mine)
    fs::remove(file, ec);
  MPI_Barrier(world.raw());
  if (world.rank() == 0) {
    const int dir = ::open(g_dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dir >= 0) {
      ::syncfs(dir);
      ::close(dir);
    }
  }
  MPI_Barrier(world.raw());
}

void BM_Checkpoint(benchmark::State& state, const std::string& layout) {
  const Communicator& world = Communicator::world();
  cubelm::train::Trainer trainer(deck(layout, world.size()));
  const std::string path = g_dir + "/step_00000000.h5";
  const std::string raw = g_dir + "/raw." + std::to_string(world.rank());
  double save_s = 0, load_s = 0, raw_write_s = 0, raw_read_s = 0, gb = 0;
  double raw_direct_s = 0; // -1 where the file system refuses O_DIRECT
  double raw_one_s = 0;    // the first rank alone, with O_DIRECT (on more than one rank)
  for (auto _ : state) {
    remove_before_write(world, path, world.rank() == 0);
    const double save = timed(world, [&] { trainer.save(path); });
    save_s += save;
    std::uint64_t bytes = 0;
    if (world.rank() == 0) {
      bytes = fs::file_size(path);
      drop_cached(path);
    }
    MPI_Bcast(&bytes, 1, MPI_UINT64_T, 0, world.raw());
    gb = static_cast<double>(bytes) * 1e-9;
    load_s += timed(world, [&] { trainer.resume(path); });
    // The raw rate: the same bytes, each rank its share, to files of their own.
    const std::uint64_t share = (bytes + world.size() - 1) / world.size();
    remove_before_write(world, raw, true);
    raw_write_s += timed(world, [&] { raw_write(raw, share); });
    drop_cached(raw);
    raw_read_s += timed(world, [&] { raw_read(raw); });
    int direct = 1;
    remove_before_write(world, raw, true);
    const double direct_s = timed(world, [&] { direct = raw_write(raw, share, true); });
    MPI_Allreduce(MPI_IN_PLACE, &direct, 1, MPI_INT, MPI_MIN, world.raw());
    raw_direct_s = direct && raw_direct_s >= 0 ? raw_direct_s + direct_s : -1;
    if (raw_direct_s > 0 && world.size() > 1) {
      remove_before_write(world, raw, true);
      raw_one_s += timed(world, [&] {
        if (world.rank() == 0)
          raw_write(raw, bytes, true);
      });
    }
    state.SetIterationTime(save); // the benchmark's time: the save's
  }
  std::error_code ec;
  fs::remove(raw, ec);
  const double n = static_cast<double>(state.iterations());
  state.counters["ranks"] = world.size();
  state.counters["GB"] = gb;
  state.counters["write_GB/s"] = gb * n / save_s;
  state.counters["read_GB/s"] = gb * n / load_s;
  state.counters["raw_write_GB/s"] = gb * n / raw_write_s;
  state.counters["raw_read_GB/s"] = gb * n / raw_read_s;
  // The raw write rate is the faster of the two ways to write the same bytes.
  double raw_best_s = raw_write_s;
  if (raw_direct_s > 0) {
    state.counters["raw_direct_GB/s"] = gb * n / raw_direct_s;
    if (raw_one_s > 0)
      state.counters["raw_one_GB/s"] = gb * n / raw_one_s;
    raw_best_s = std::min(raw_best_s, raw_direct_s);
  }
  state.counters["write_%raw"] = 100.0 * raw_best_s / save_s;
  state.counters["read_%raw"] = 100.0 * raw_read_s / load_s;
}

void BM_CheckpointAsync(benchmark::State& state, const std::string& layout) {
  const Communicator& world = Communicator::world();
  cubelm::train::Trainer trainer(deck(layout, world.size(), true));
  if (!trainer.saves_in_background())
    throw cubelm::Error("bench_checkpoint: " + trainer.async_note());
  const std::string sync_path = g_dir + "/step_00000000.h5";
  const std::string async_path = g_dir + "/step_00000001.h5";
  double sync_s = 0, stall_s = 0, step_s = 0, during_s = 0, write_s = 0;
  for (auto _ : state) {
    remove_before_write(world, sync_path, world.rank() == 0);
    sync_s += timed(world, [&] { trainer.save(sync_path); });
    step_s += timed(world, [&] { trainer.step(); });
    remove_before_write(world, async_path, world.rank() == 0);
    const double stall =
        timed(world, [&] { trainer.save_in_background(async_path, std::function<void()>()); });
    stall_s += stall;
    cubelm::train::StepMetrics during;
    during_s += timed(world, [&] { during = trainer.step(); });
    // The step collects the write if every rank's writer finished during it.
    std::optional<cubelm::train::BackgroundResult> r;
    if (!during.background.path.empty())
      r = during.background;
    else
      r = trainer.finish_background_save();
    if (!r || !r->error.empty())
      throw cubelm::Error("bench_checkpoint: the background save failed: " +
                          (r ? r->error : std::string("none in flight")));
    double slowest = 0;
    MPI_Allreduce(&r->seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, world.raw());
    write_s += slowest;
    state.SetIterationTime(stall); // the benchmark's time: the loop's stall
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["ranks"] = world.size();
  state.counters["sync_s"] = sync_s / n;
  state.counters["stall_s"] = stall_s / n;
  state.counters["stall_%sync"] = 100.0 * stall_s / sync_s;
  state.counters["step_s"] = step_s / n;
  state.counters["step_during_write_s"] = during_s / n;
  state.counters["write_s"] = write_s / n;
  if (world.rank() == 0) {
    std::error_code ec;
    fs::remove(async_path, ec);
  }
}

bool is_cube(int n) {
  for (int q = 1; q * q * q <= n; ++q)
    if (q * q * q == n)
      return true;
  return false;
}

} // namespace

int main(int argc, char** argv) {
  cubelm::kernels::ensure_blas_kernels(argv); // the kernels cubelm runs (kernels/blas.hpp)
  cubelm::Environment env(argc, argv, true);  // checkpoint_async's writer thread talks to MPI
  try {
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      if (std::strncmp(argv[i], "--dir=", 6) == 0)
        g_dir = argv[i] + 6;
      else if (std::strncmp(argv[i], "--writers=", 10) == 0)
        g_writers = argv[i] + 10;
      else if (std::strncmp(argv[i], "--iterations=", 13) == 0)
        g_iterations = std::max(1, std::atoi(argv[i] + 13));
      else
        args.push_back(argv[i]);
    }
    if (g_writers != "all" && g_writers != "one" && g_writers != "both")
      throw cubelm::Error("--writers=" + g_writers + ": it is \"all\", \"one\" or \"both\"");
    const int world = Communicator::world().size();
    if (Communicator::world().rank() == 0)
      fs::create_directories(g_dir);
    MPI_Barrier(Communicator::world().raw());
    auto reg = [](const std::string& layout) {
      benchmark::RegisterBenchmark(("checkpoint/" + layout).c_str(), BM_Checkpoint, layout)
          ->Iterations(g_iterations)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
      benchmark::RegisterBenchmark(("checkpoint_async/" + layout).c_str(), BM_CheckpointAsync,
                                   layout)
          ->Iterations(g_iterations)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
    };
    std::vector<std::string> layouts;
    if (world == 1)
      layouts = {"none"};
    else
      layouts = {"1d"};
    if (world > 1 && is_cube(world))
      layouts.push_back("3d");
    if (world > 1)
      layouts.push_back("zero");
    for (const std::string& layout : layouts) {
      if (g_writers != "one")
        reg(layout);
      if (g_writers != "all" && world > 1) // one rank writes alone either way
        reg(layout + "/one");
    }
    int n = static_cast<int>(args.size());
    args.push_back(nullptr);
    cubelm::perf::run_benchmarks(env.world_rank(), n, args.data());
    MPI_Barrier(Communicator::world().raw());
    if (Communicator::world().rank() == 0) {
      std::error_code ec;
      fs::remove(g_dir + "/step_00000000.h5", ec);
      fs::remove(g_dir, ec); // only if empty: the user's files stay
    }
  } catch (const std::exception& e) {
    // Every rank builds the same decks, so every rank fails alike.
    if (env.world_rank() == 0)
      std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
