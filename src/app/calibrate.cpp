// `cubelm plan --calibrate`: measure what the planner's machine model needs on the
// machine the job runs on, with every rank at work at once (as in training, where the
// ranks of a node share its cores and memory), and write a machine file.

#include "cubelm/app/plan.hpp"

#include "cubelm/comm/grid.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/memory_info.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/tp/shapes.hpp"

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace cubelm::app {

namespace {

// The mean over ranks of a per-rank value.
double mean(double x) {
  double sum = 0;
  int size = 1;
  MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return sum / size;
}

// The slowest rank's value: a collective takes as long as its slowest rank.
double slowest(double x) {
  double out = 0;
  MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// GFLOP/s of C[m, n] = A[m, k] B[k, n] on this rank while all ranks run theirs.
double gemm_rate(int m, int n, int k) {
  kernels::Mat<real> a("a", m, k), b("b", k, n), c("c", m, n);
  Kokkos::deep_copy(a, real(0.5));
  Kokkos::deep_copy(b, real(0.25));
  const ExecSpace exec;
  kernels::gemm<real>(exec, false, false, 1, a, b, 0, c);
  exec.fence();
  MPI_Barrier(MPI_COMM_WORLD);
  const int reps = 5;
  Kokkos::Timer timer;
  for (int r = 0; r < reps; ++r)
    kernels::gemm<real>(exec, false, false, 1, a, b, 0, c);
  exec.fence();
  return 2.0 * m * n * static_cast<double>(k) * reps / timer.seconds() / 1e9;
}

// GB/s of a copy-and-add over 32 MiB arrays (reads two, writes one), all ranks at once.
double memory_rate() {
  const std::size_t n = std::size_t(8) << 20;
  kernels::Vec<real> x("x", n), y("y", n), z("z", n);
  Kokkos::deep_copy(x, real(1));
  Kokkos::deep_copy(y, real(2));
  const ExecSpace exec;
  const auto run = [&] {
    Kokkos::parallel_for(
        "cubelm::calibrate_triad", Kokkos::RangePolicy<ExecSpace>(exec, 0, n),
        KOKKOS_LAMBDA(const std::size_t i) { z(i) = x(i) + real(0.5) * y(i); });
  };
  run();
  exec.fence();
  MPI_Barrier(MPI_COMM_WORLD);
  const int reps = 10;
  Kokkos::Timer timer;
  for (int r = 0; r < reps; ++r)
    run();
  exec.fence();
  return 3.0 * 4 * static_cast<double>(n) * reps / timer.seconds() / 1e9;
}

// GB/s at which every rank together writes a checkpoint of the deck's model (its tensors and
// their moments, each split by rows over the ranks) with cubelm's writer (the deck's
// checkpoint.writers) into the deck's checkpoint.dir: the file system the run's checkpoints go to.
// The probe file is removed. Sets `bytes` to the file's size.
double checkpoint_rate(const Deck& deck, double& bytes) {
  const comm::Communicator world = comm::Communicator::world();
  std::error_code ec;
  bool made = false; // the directory, made here for the probe, goes with it
  if (world.rank() == 0)
    made = std::filesystem::create_directories(deck.checkpoint.dir, ec); // else the writer's error
  const std::string path = deck.checkpoint.dir + "/calibrate_probe.h5";
  const std::vector<std::vector<std::uint64_t>> shapes = cost::checkpoint_shapes(deck.model);
  std::vector<float> data;
  MPI_Barrier(MPI_COMM_WORLD);
  Kokkos::Timer timer;
  {
    io::CheckpointWriter w(path, world, io::writers_named(deck.checkpoint.writers));
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const std::uint64_t rows = shapes[t][0];
      const auto begin = rows * static_cast<std::uint64_t>(world.rank()) / world.size();
      const auto end = rows * static_cast<std::uint64_t>(world.rank() + 1) / world.size();
      const io::Block block = io::Block::rows(shapes[t], begin, end);
      data.resize(static_cast<std::size_t>(block.size()), 0.02f);
      w.write("/probe/" + std::to_string(t), shapes[t], block, data.data());
    }
    w.close();
  }
  const double seconds = slowest(timer.seconds());
  if (world.rank() == 0) {
    bytes = static_cast<double>(std::filesystem::file_size(path, ec));
    std::filesystem::remove(path, ec);
    if (made)
      std::filesystem::remove(deck.checkpoint.dir, ec);
  }
  MPI_Bcast(&bytes, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return bytes / seconds / 1e9;
}

struct Sample {
  int ranks;
  double bytes, seconds; // message bytes B, seconds per all-reduce
};

} // namespace

io::Machine measure_machine(const std::string& deck_path, std::string& report) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int per_node = 1;
  MPI_Comm_size(node, &per_node);
  MPI_Comm_free(&node);

  // The layer's largest product at the deck's shapes, as its tensor mode splits the
  // activations (tp::activation_split): this rank's rows of the micro-batch, its columns of
  // the residual stream in, of the MLP's hidden layer out ([b T, H] x [H, 4H / p] in 1d).
  int m = 512, n = 512, k = 512;
  double checkpoint_gbs = 0, checkpoint_bytes = 0;
  if (!deck_path.empty()) {
    const Deck deck = cost::load_deck(deck_path);
    checkpoint_gbs = checkpoint_rate(deck, checkpoint_bytes);
    const tp::ActivationSplit split = tp::activation_split(comm::layout_of(deck.parallel));
    m = deck.micro_batch() / split.sequences * deck.model.seq_len;
    k = deck.model.hidden / split.outer;
    n = 4 * deck.model.hidden / split.inner;
  }
  const double gflops = mean(gemm_rate(m, n, k));
  const double gbs = mean(memory_rate());

  // All-reduces over groups of 2, 4, ... ranks (the dp groups of a dp x pp grid).
  std::vector<Sample> samples;
  for (int size = 2; size <= world; size *= 2) {
    if (world % size != 0)
      continue;
    comm::Layout layout;
    layout.dp = size;
    layout.pp = world / size;
    const comm::ProcessGrid grid(layout, comm::Communicator::world());
    const ExecSpace exec;
    for (const std::size_t floats :
         {std::size_t(256), std::size_t(4096), std::size_t(65536), std::size_t(1) << 20}) {
      View1<real> v("v", floats);
      grid.dp().all_reduce(exec, v);
      MPI_Barrier(MPI_COMM_WORLD);
      const int reps = floats >= (std::size_t(1) << 20) ? 5 : 20;
      Kokkos::Timer timer;
      for (int r = 0; r < reps; ++r)
        grid.dp().all_reduce(exec, v);
      samples.push_back({size, 4.0 * static_cast<double>(floats), slowest(timer.seconds() / reps)});
    }
  }
  // Least squares of t = alpha steps + bytes_sent / beta, steps = 2 ceil(log2 p) and
  // bytes_sent = 2 (p - 1) / p B: the model cost::collective_seconds charges.
  const auto steps_of = [](int p) { return 2 * std::ceil(std::log2(p)); };
  double latency_us = 0, bandwidth_gbs = gbs;
  if (!samples.empty()) {
    double ss = 0, sb = 0, bb = 0, st = 0, bt = 0;
    for (const Sample& s : samples) {
      const double steps = steps_of(s.ranks), sent = 2.0 * (s.ranks - 1) / s.ranks * s.bytes;
      // Relative errors: each sample weighted by 1 / t, so small messages count too.
      const double w = 1 / (s.seconds * s.seconds);
      ss += w * steps * steps, sb += w * steps * sent, bb += w * sent * sent;
      st += w * steps * s.seconds, bt += w * sent * s.seconds;
    }
    const double det = ss * bb - sb * sb;
    double alpha = det != 0 ? (st * bb - bt * sb) / det : 0;
    double inv_beta = det != 0 ? (ss * bt - sb * st) / det : 0;
    if (alpha < 0 || inv_beta <= 0) { // a degenerate fit: one term alone
      alpha = std::max(0.0, alpha);
      inv_beta = 0;
      for (const Sample& s : samples)
        inv_beta = std::max(inv_beta, (s.seconds - alpha * steps_of(s.ranks)) /
                                          (2.0 * (s.ranks - 1) / s.ranks * s.bytes));
    }
    latency_us = alpha * 1e6;
    bandwidth_gbs = inv_beta > 0 ? 1 / inv_beta / 1e9 : gbs;
  }

  const HostMemory host = read_host_memory();
  io::Machine machine;
  char host_name[256] = {0};
  gethostname(host_name, sizeof(host_name) - 1);
  machine.name = std::string("calibrated: ") + host_name + ", " + std::to_string(world) + " rank" +
                 (world == 1 ? "" : "s");
  machine.devices_per_node = per_node;
  machine.memory_gib =
      host.available() ? static_cast<double>(*host.available()) / per_node / 1073741824.0 : 1.0;
  machine.memory_gbs = gbs;
  machine.peak_tflops_fp32 = machine.peak_tflops_tf32 = machine.peak_tflops_bf16 = gflops / 1e3;
  machine.gemm_efficiency = 1;
  machine.intra = io::NetworkLevel{bandwidth_gbs, latency_us};
  machine.inter = machine.intra;
  machine.checkpoint_gbs = checkpoint_gbs;
  std::ostringstream comment;
  comment << "# Written by `cubelm plan --calibrate` on " << world << " rank(s), " << per_node
          << " per node, every rank measuring at once.\n"
          << "# gemm [" << m << ", " << k << "] x [" << k << ", " << n << "]: " << gflops
          << " GFLOP/s per rank (every precision: the same products on CPUs).\n"
          << "# memory: " << gbs << " GB/s per rank (x + 0.5 y over 32 MiB arrays).\n"
          << "# all-reduce, seconds per call (slowest rank), fitted as\n"
          << "#   t = latency * 2 ceil(log2 p) + 2 (p - 1) / p * bytes / bandwidth:\n";
  for (const Sample& s : samples) {
    const double fit = latency_us * 1e-6 * steps_of(s.ranks) +
                       2.0 * (s.ranks - 1) / s.ranks * s.bytes / (bandwidth_gbs * 1e9);
    comment << "#   p = " << s.ranks << ", " << s.bytes << " bytes: " << s.seconds
            << " s measured, " << fit << " s fitted\n";
  }
  if (checkpoint_gbs > 0)
    comment << "# checkpoint: " << checkpoint_bytes / 1e9 << " GB (the deck's model and moments) "
            << "written by every rank at once at " << checkpoint_gbs << " GB/s.\n";
  else
    comment << "# checkpoint: not measured (no deck), so no checkpoint_gbs.\n";
  comment << "# Between nodes: one node was measured, so inter_node repeats intra_node;\n"
          << "# set it from the network's data sheet for a job on several nodes.\n";
  report = comment.str();
  (void)rank;
  return machine;
}

int run_calibrate(const PlanOptions& o, const Environment& env) {
  if (o.output.empty())
    throw Error("cubelm plan --calibrate needs -o FILE (the machine file to write)", true);
  std::string report;
  const io::Machine machine = measure_machine(o.deck, report);
  if (env.world_rank() != 0)
    return 0;
  std::ofstream file(o.output);
  if (!file)
    throw Error(o.output + ": cannot write the machine file", true);
  file << io::machine_toml(machine, report);
  std::printf("%s: machine file written: gemm %.3g GFLOP/s per rank, memory %.3g GB/s, "
              "network latency %.3g us per step and bandwidth %.3g GB/s, checkpoints %.3g GB/s\n",
              o.output.c_str(), machine.peak_tflops_fp32 * 1e3, machine.memory_gbs,
              machine.intra.latency_us, machine.intra.bandwidth_gbs, machine.checkpoint_gbs);
  return 0;
}

} // namespace cubelm::app
