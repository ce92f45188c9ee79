#include "cubelm/app/commands.hpp"

#include "cubelm/app/plan.hpp"
#include "cubelm/app/training.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/core/devices.hpp"
#include "cubelm/core/format.hpp"
#include "cubelm/core/memory_check.hpp"
#include "cubelm/core/memory_info.hpp"
#include "cubelm/core/version.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/model/memory.hpp"
#include "cubelm/model/traffic.hpp"
#include "cubelm/train/checkpointing.hpp"
#include "cubelm/train/trainer.hpp"

#include <Kokkos_Core.hpp>
#include <hdf5.h>
#include <mpi.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#ifdef CUBELM_ENABLE_NCCL
#include <nccl.h>
#endif

namespace cubelm::app {

namespace {

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string s(text, static_cast<std::size_t>(length));
  const auto end = s.find_first_of(",\n");
  return end == std::string::npos ? s : s.substr(0, end);
}

std::string memory_line(const Deck& deck) {
  const model::Memory mem = model::estimate_memory(deck);
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "memory     per rank: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
                "activations %.2f MiB (estimate%s)\n",
                mem.parameters / 1048576.0, mem.gradients / 1048576.0, mem.optimizer / 1048576.0,
                mem.activations / 1048576.0,
                deck.parallel.pipeline_size > 1 ? ", fullest pipeline stage" : "");
  std::string out = buf;
  const ParallelConfig& p = deck.parallel;
  if (p.pipeline_size > 1 || p.microbatches > 1) {
    // The schedule under the unit-cost model (docs/pipeline.md).
    const plan::PipelinePlan plan = plan::make_plan(p, deck.model);
    const plan::Timeline t = plan::simulate(plan);
    out += "pipeline   idle/busy per stage (unit-cost model):";
    for (int s = 0; s < plan.stages; ++s) {
      std::snprintf(buf, sizeof(buf), " %.3f", t.bubble(s));
      out += buf;
    }
    out += "; activation sets held:";
    for (int n : t.peak_in_flight)
      out += " " + std::to_string(n);
    out += "\n";
  }
  return out;
}

} // namespace

std::string version_text() {
  std::ostringstream out;
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_release);
  out << "cubelm " << CUBELM_VERSION_STRING << " (" << CUBELM_BUILD_TYPE << ", "
      << CUBELM_CXX_COMPILER << ")\n"
      << "  Kokkos       " << compat::kokkos_version_string() << ", execution space "
      << Kokkos::DefaultExecutionSpace::name() << " (host "
      << Kokkos::DefaultHostExecutionSpace::name() << ")\n"
      << "  BLAS         " << kernels::blas_threading() << "\n"
      << "  BLAS kernels " << kernels::blas_kernel_decision().note << "\n"
      << "  CPU          " << cpu_features().describe() << "; cubelm's kernels built for "
      << isa_name(kernels::kernels_built_isa()) << "\n"
      << "  MPI          " << mpi_library() << "\n"
      << "  HDF5         " << h5_major << "." << h5_minor << "." << h5_release << " (parallel)\n"
      << "  Device       " << device_summary() << "\n";
#ifdef CUBELM_ENABLE_NCCL
  int nccl = 0;
  ncclGetVersion(&nccl);
  out << "  NCCL         " << nccl / 10000 << "." << (nccl / 100) % 100 << "." << nccl % 100
      << "\n";
#else
  out << "  NCCL         not built in (collectives through MPI)\n";
#endif
  return out.str();
}

namespace {

// MoE models and context parallelism: the maps of the same ranks (docs/grid.md),
// attention's and the MoE layers'; nothing for other dense models.
std::string maps_line(const Deck& deck) {
  const ModelConfig& m = deck.model;
  const ParallelConfig& p = deck.parallel;
  if (m.experts <= 1 && p.context_size == 1)
    return "";
  std::ostringstream out;
  const int ranks = p.tensor_size * p.context_size * p.data_size;
  out << "maps       per pipeline stage, " << ranks << " rank" << (ranks == 1 ? "" : "s")
      << ": attention" << (m.experts > 1 ? " and dense" : "") << " layers tp " << p.tensor_size
      << " x cp " << p.context_size << " x dp " << p.data_size;
  if (p.context_size > 1)
    out << " (each sequence in " << 2 * p.context_size << " chunks of "
        << m.seq_len / (2 * p.context_size) << " tokens, 2 per rank)";
  if (m.experts <= 1)
    return out.str() + "\n";
  out << "; MoE layers (" << m.experts << " experts, top " << m.top_k << ", every " << m.moe_every
      << (m.moe_every == 1   ? "st"
          : m.moe_every == 2 ? "nd"
          : m.moe_every == 3 ? "rd"
                             : "th")
      << " layer) expert tp " << p.expert_tensor_size << " x ep " << p.expert_size
      << " x expert dp " << comm::layout_of(p).expert_copies() << ": " << m.experts / p.expert_size
      << " expert" << (m.experts / p.expert_size == 1 ? "" : "s")
      << (p.expert_tensor_size > 1 ? " (1/" + std::to_string(p.expert_tensor_size) + " of each)"
                                   : std::string())
      << " per rank\n";
  return out.str();
}

} // namespace

std::string describe(const Deck& deck) {
  const ModelConfig& m = deck.model;
  const ParallelConfig& p = deck.parallel;
  const comm::Layout layout = comm::layout_of(p);
  const double tokens = static_cast<double>(deck.train.global_batch) * m.seq_len;
  std::ostringstream out;
  out << "model      vocab " << m.vocab_size << ", context " << m.seq_len << ", hidden " << m.hidden
      << ", heads " << m.heads << ", layers " << m.layers << ": "
      << si(static_cast<double>(model::parameter_count(m)), 2) << " parameters\n"
      << "layout     " << layout.describe() << ": " << layout.world_size() << " process"
      << (layout.world_size() == 1 ? "" : "es") << ", schedule " << schedule_name(p.schedule)
      << ", microbatches " << p.microbatches << ", zero " << p.zero << ", recompute "
      << recompute_name(p.recompute) << "\n"
      << maps_line(deck) << "batch      " << deck.train.global_batch
      << " sequences/step = " << p.data_size << " (data) x " << p.microbatches
      << " (microbatches) x " << deck.micro_batch() << " (micro-batch); " << si(tokens, 2)
      << " tokens/step, " << deck.train.steps << " steps\n"
      << "work       " << si(model::flops_per_token(m) * tokens, 2)
      << " FLOP per step (6 N + 12 L H T per token)\n"
      << memory_line(deck) << "traffic    " << format_bytes(model::comm_bytes_per_step(deck, 0))
      << " sent per rank per step (rank 0, closed form: docs/communication.md)\n"
      << "optimizer  AdamW lr " << deck.optimizer.lr << " -> " << deck.optimizer.min_lr
      << ", warmup " << deck.optimizer.warmup_steps << ", weight decay "
      << deck.optimizer.weight_decay << ", clip " << deck.optimizer.grad_clip << "\n"
      << "data       " << deck.data.format << (deck.data.path.empty() ? "" : " " + deck.data.path)
      << ", sampler " << deck.data.sampler << "\n";
  return out.str();
}

std::string check_json(const Deck& deck, const std::string& deck_path) {
  const ParallelConfig& p = deck.parallel;
  const comm::Layout layout = comm::layout_of(p);
  const model::Memory mem = model::estimate_memory(deck);
  const double tokens = static_cast<double>(deck.train.global_batch) * deck.model.seq_len;
  std::ostringstream out;
  out.precision(15);
  const auto text = [](const std::string& s) {
    std::string q = "\"";
    for (const char c : s)
      q += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    return q + "\"";
  };
  out << "{\"deck\": " << text(deck_path)
      << ", \"layout\": {\"tensor_mode\": " << text(mode_name(p.tensor_mode))
      << ", \"tensor_size\": " << p.tensor_size << ", \"pipeline_size\": " << p.pipeline_size
      << ", \"data_size\": " << p.data_size << ", \"schedule\": " << text(schedule_name(p.schedule))
      << ", \"virtual_stages\": " << p.virtual_stages << ", \"microbatches\": " << p.microbatches
      << ", \"zero\": " << p.zero
      << ", \"sequence_parallel\": " << (p.sequence_parallel ? "true" : "false")
      << ", \"expert_size\": " << p.expert_size
      << ", \"expert_tensor_size\": " << p.expert_tensor_size
      << ", \"context_size\": " << p.context_size
      << ", \"recompute\": " << text(recompute_name(p.recompute))
      << "}, \"world\": " << layout.world_size()
      << ", \"parameters\": " << model::parameter_count(deck.model)
      << ", \"tokens_per_step\": " << tokens
      << ", \"flops_per_step\": " << model::flops_per_token(deck.model) * tokens
      << ", \"mem_bytes\": " << mem.total() << ", \"memory\": {\"parameters\": " << mem.parameters
      << ", \"gradients\": " << mem.gradients << ", \"optimizer\": " << mem.optimizer
      << ", \"activations\": " << mem.activations << "}";
  // Rank 0's traffic (pipeline stage 0), the quantity of the metrics' comm_bytes.
  const std::vector<model::TrafficVolume> traffic = model::traffic_per_step(deck, 0);
  double total = 0;
  for (const auto& v : traffic)
    total += v.bytes;
  out << ", \"comm_bytes\": " << total << ", \"comm\": {";
  for (std::size_t i = 0; i < traffic.size(); ++i)
    out << (i == 0 ? "" : ", ") << text(traffic[i].group + "." + comm::kind_name(traffic[i].kind))
        << ": {\"calls\": " << traffic[i].calls << ", \"bytes\": " << traffic[i].bytes << "}";
  out << "}}";
  return out.str();
}

int run_check(const std::string& deck_path, const Environment& env, bool json,
              const std::string& machine_path) {
  const Deck deck = io::load_deck(deck_path);
  const comm::Layout layout = comm::layout_of(deck.parallel);
  // On one process this is a dry check of the deck; under mpiexec the job
  // itself must fit the layout.
  if (env.world_size() > 1)
    layout.validate_for_world(env.world_size());
  // The planner's prediction for this layout (docs/planner.md), with a machine file.
  std::optional<io::Machine> machine;
  if (!machine_path.empty())
    machine = io::load_machine(machine_path);
  if (json) {
    std::string text = check_json(deck, deck_path);
    if (machine) {
      text.pop_back(); // the object's closing brace
      text += ", \"prediction\": " + prediction_json(deck, model::predict(deck, *machine)) + "}";
    }
    if (env.world_rank() == 0)
      std::printf("%s\n", text.c_str());
    return 0;
  }
  if (env.world_rank() == 0) {
    std::printf("%s: valid deck\n%s", deck_path.c_str(), describe(deck).c_str());
    if (machine)
      std::printf("%s", prediction_text(deck, model::predict(deck, *machine), *machine).c_str());
    if (env.world_size() == 1 && layout.world_size() > 1)
      std::printf("launch     this deck needs %d processes (mpiexec -n %d)\n", layout.world_size(),
                  layout.world_size());
  }
  // What `cubelm train` would decide here (docs/reliability.md#memory-admission); on one
  // process of a larger layout the node's ranks do not share the memory yet.
  const std::uint64_t need = static_cast<std::uint64_t>(model::estimate_memory(deck).total());
  const MemoryCheck mem = check_memory(need);
  if (env.world_rank() == 0) {
    if (mem.skipped)
      std::printf("available  not checked (%s=1)\n", kSkipMemoryCheck);
    else
      std::printf("available  %s per rank (%s, shared by %d rank%s): the fullest rank needs %s, "
                  "%s\n",
                  format_bytes(static_cast<double>(mem.available)).c_str(), mem.source.c_str(),
                  mem.sharing, mem.sharing == 1 ? "" : "s",
                  format_bytes(static_cast<double>(mem.need)).c_str(),
                  mem.fits ? "fits"
                           : "does not fit: cubelm train would refuse it here (with the keys "
                             "that lower the need)");
  }
  return 0;
}

int run_train(const std::string& deck_path, const Environment& env) {
  const Deck deck = io::load_deck(deck_path);
  comm::layout_of(deck.parallel).validate_for_world(env.world_size());
  return run_training(deck, std::cout);
}

int run_data(const std::vector<std::string>& inputs, const std::string& output,
             const Environment& env) {
  // One writer: the file is made on rank 0 alone.
  if (env.world_rank() == 0) {
    const std::int64_t count = io::text_to_llmc(inputs, output);
    std::printf("%s: %lld tokens (bytes of %zu text file%s, vocabulary 256)\n", output.c_str(),
                static_cast<long long>(count), inputs.size(), inputs.size() == 1 ? "" : "s");
  }
  return 0;
}

int run_init(const std::string& deck_path, const std::string& output, const Environment& env) {
  const Deck deck = io::load_deck(deck_path);
  comm::layout_of(deck.parallel).validate_for_world(env.world_size());
  // Parameters depend only on (seed, name, index): one micro-batch row of activations suffices.
  const model::GridModel<real> net(deck.model, deck.micro_batch(),
                                   static_cast<std::uint64_t>(deck.train.seed),
                                   comm::layout_of(deck.parallel), comm::Communicator::world());
  train::save_checkpoint(output, deck, *net.model, nullptr, nullptr, 0,
                         comm::Communicator::world());
  if (env.world_rank() == 0)
    std::printf("%s: step-0 checkpoint of %s (%.3g M parameters, seed %lld)\n", output.c_str(),
                deck_path.c_str(), model::parameter_count(deck.model) / 1e6,
                static_cast<long long>(deck.train.seed));
  return 0;
}

int run_verify(const std::vector<std::string>& files, const Environment& env) {
  int damaged = 0;
  const comm::Communicator world = comm::Communicator::world();
  for (const std::string& file : files) {
    const io::Verification v = io::verify_checkpoint(file, world);
    if (env.world_rank() != 0)
      continue;
    if (!v.problem.empty()) {
      ++damaged;
      std::printf("%s: DAMAGED: %s\n", file.c_str(), v.problem.c_str());
    } else if (!v.checksums) {
      std::printf("%s: readable, %d datasets, but written without checksums: not verified\n",
                  file.c_str(), v.datasets);
    } else {
      std::printf("%s: ok, %d datasets verified\n", file.c_str(), v.datasets);
    }
  }
  return damaged > 0 ? 1 : 0;
}

} // namespace cubelm::app
