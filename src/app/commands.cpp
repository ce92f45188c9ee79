#include "cubelm/app/commands.hpp"

#include "cubelm/app/plan.hpp"
#include "cubelm/app/training.hpp"
#include "cubelm/core/compat.hpp"
#include "cubelm/core/devices.hpp"
#include "cubelm/core/format.hpp"
#include "cubelm/core/memory_check.hpp"
#include "cubelm/core/memory_info.hpp"
#include "cubelm/core/placement.hpp"
#include "cubelm/core/version.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/traffic.hpp"
#include "cubelm/io/bpe.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/sampler.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/train/checkpointing.hpp"
#include "cubelm/train/trainer.hpp"

#include <Kokkos_Core.hpp>
#include <hdf5.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
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
  const cost::Memory mem = cost::estimate_memory(deck);
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "memory     per rank: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
                "activations %.2f MiB (estimate%s)\n",
                mem.parameters / 1048576.0, mem.gradients / 1048576.0, mem.optimizer / 1048576.0,
                mem.activations / 1048576.0,
                deck.parallel.pipeline_size > 1 ? ", fullest pipeline stage" : "");
  std::string out = buf;
  if (mem.checkpoint_buffers > 0) {
    std::snprintf(buf, sizeof(buf),
                  "           host buffers of background checkpoints %.2f MiB per rank "
                  "(checkpoint.async)\n",
                  mem.checkpoint_buffers / 1048576.0);
    out += buf;
  }
  if (mem.writer_slabs > 0) {
    std::snprintf(buf, sizeof(buf),
                  "           host memory of the checkpoint writer %.2f MiB on the first rank "
                  "while it saves (it writes alone: %s)\n",
                  mem.writer_slabs / 1048576.0,
                  deck.checkpoint.writers == "one" ? "checkpoint.writers = \"one\"" : "one rank");
    out += buf;
  }
  const ParallelConfig& p = deck.parallel;
  if (p.pipeline_size > 1 || p.microbatches > 1) {
    // The schedule under the unit-cost model (docs/pipeline.md).
    const pipeline::PipelinePlan plan = pipeline::make_plan(p, deck.model);
    const pipeline::Timeline t = pipeline::simulate(plan);
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
      << si(static_cast<double>(cost::parameter_count(m)), 2) << " parameters\n"
      << "layout     " << layout.describe() << ": " << layout.world_size() << " process"
      << (layout.world_size() == 1 ? "" : "es") << ", schedule " << schedule_name(p.schedule)
      << ", microbatches " << p.microbatches << ", zero " << p.zero << ", recompute "
      << recompute_name(p.recompute) << "\n"
      << maps_line(deck) << "batch      " << deck.train.global_batch
      << " sequences/step = " << p.data_size << " (data) x " << p.microbatches
      << " (microbatches) x " << deck.micro_batch() << " (micro-batch); " << si(tokens, 2)
      << " tokens/step, " << deck.train.steps << " steps\n"
      << "work       " << si(cost::flops_per_token(m) * tokens, 2)
      << " FLOP per step (6 N + 12 L H T per token)\n"
      << memory_line(deck) << "traffic    " << format_bytes(cost::comm_bytes_per_step(deck, 0))
      << " sent per rank per step (rank 0, closed form: docs/communication.md)\n"
      << "optimizer  AdamW lr " << deck.optimizer.lr << " -> " << deck.optimizer.min_lr
      << ", warmup " << deck.optimizer.warmup_steps << ", weight decay "
      << deck.optimizer.weight_decay << ", clip " << deck.optimizer.grad_clip << "\n"
      << "data       " << deck.data.format << (deck.data.path.empty() ? "" : " " + deck.data.path)
      << ", sampler " << deck.data.sampler << "\n"
      << "saves      " << format_bytes(static_cast<double>(cost::checkpoint_bytes(deck.model)))
      << " per checkpoint (model and AdamW moments), "
      << (deck.checkpoint.interval > 0
              ? "every " + std::to_string(deck.checkpoint.interval) + " steps and at the end"
              : std::string("at the end"))
      << (deck.checkpoint.async ? ", written in the background" : "") << "\n";
  return out.str();
}

namespace {

// A JSON string of s: quotes, backslashes and newlines escaped.
std::string json_text(const std::string& s) {
  std::string q = "\"";
  for (const char c : s)
    q += c == '"' || c == '\\' ? std::string("\\") + c
         : c == '\n'           ? std::string("\\n")
                               : std::string(1, c);
  return q + "\"";
}

} // namespace

std::string check_json(const Deck& deck, const std::string& deck_path) {
  const ParallelConfig& p = deck.parallel;
  const comm::Layout layout = comm::layout_of(p);
  const cost::Memory mem = cost::estimate_memory(deck);
  const double tokens = static_cast<double>(deck.train.global_batch) * deck.model.seq_len;
  std::ostringstream out;
  out.precision(15);
  out << "{\"deck\": " << json_text(deck_path)
      << ", \"layout\": {\"tensor_mode\": " << json_text(mode_name(p.tensor_mode))
      << ", \"tensor_size\": " << p.tensor_size << ", \"pipeline_size\": " << p.pipeline_size
      << ", \"data_size\": " << p.data_size
      << ", \"schedule\": " << json_text(schedule_name(p.schedule))
      << ", \"virtual_stages\": " << p.virtual_stages << ", \"microbatches\": " << p.microbatches
      << ", \"zero\": " << p.zero
      << ", \"sequence_parallel\": " << (p.sequence_parallel ? "true" : "false")
      << ", \"expert_size\": " << p.expert_size
      << ", \"expert_tensor_size\": " << p.expert_tensor_size
      << ", \"context_size\": " << p.context_size
      << ", \"recompute\": " << json_text(recompute_name(p.recompute))
      << "}, \"world\": " << layout.world_size()
      << ", \"parameters\": " << cost::parameter_count(deck.model)
      << ", \"tokens_per_step\": " << tokens
      << ", \"flops_per_step\": " << cost::flops_per_token(deck.model) * tokens
      << ", \"mem_bytes\": " << mem.total() << ", \"memory\": {\"parameters\": " << mem.parameters
      << ", \"gradients\": " << mem.gradients << ", \"optimizer\": " << mem.optimizer
      << ", \"activations\": " << mem.activations
      << ", \"checkpoint_buffers\": " << mem.checkpoint_buffers
      << ", \"writer_slabs\": " << mem.writer_slabs
      << "}, \"checkpoint_bytes\": " << cost::checkpoint_bytes(deck.model);
  // Rank 0's traffic (pipeline stage 0), the quantity of the metrics' comm_bytes.
  const std::vector<cost::TrafficVolume> traffic = cost::traffic_per_step(deck, 0);
  double total = 0;
  for (const auto& v : traffic)
    total += v.bytes;
  out << ", \"comm_bytes\": " << total << ", \"comm\": {";
  for (std::size_t i = 0; i < traffic.size(); ++i)
    out << (i == 0 ? "" : ", ")
        << json_text(traffic[i].group + "." + comm::kind_name(traffic[i].kind))
        << ": {\"calls\": " << traffic[i].calls << ", \"bytes\": " << traffic[i].bytes << "}";
  out << "}}";
  return out.str();
}

namespace {

// What `cubelm train` would read besides the deck, checked cheaply (headers and
// attributes, no tokens or tensors): the corpus and the checkpoints it would resume from
// or write beside. Collective (the checkpoints are opened by every rank).
struct Inputs {
  std::string data, checkpoints;     // one line each for the report
  std::vector<std::string> problems; // each a message naming the file and the rule
};

Inputs check_inputs(const Deck& deck) {
  Inputs in;
  const DataConfig& d = deck.data;
  if (d.format == "synthetic") {
    in.data = "synthetic corpus, " + std::to_string(d.synthetic_tokens) + " tokens";
  } else {
    try {
      const std::int64_t n = io::token_count(d.format, d.path);
      // The sampler's rule (T + 2 tokens at least), made once.
      io::make_sampler(d.sampler, n, deck.train.global_batch, deck.model.seq_len,
                       static_cast<std::uint64_t>(deck.train.seed));
      in.data = d.path + ": " + std::to_string(n) + " tokens (" + d.format +
                ", from the header; each token's range is checked when train reads them)";
    } catch (const Error& e) {
      in.data = d.path + ": cannot be used";
      in.problems.push_back(std::string("data.path: ") + e.what());
    }
  }
  if (d.validates() && in.problems.empty()) {
    try {
      std::int64_t corpus = d.synthetic_tokens;
      if (d.format != "synthetic")
        corpus = io::token_count(d.format, d.path);
      const std::int64_t file = d.val_path.empty() ? 0 : io::token_count(d.format, d.val_path);
      const io::TokenSplit t = io::split_tokens(deck, corpus, file);
      in.data +=
          "; validation: " +
          (d.val_path.empty() ? "the last " + std::to_string(t.validation) + " tokens held out, " +
                                    std::to_string(t.train) + " left to train on"
                              : d.val_path + ", " + std::to_string(t.validation) + " tokens") +
          ", " + std::to_string(t.batches) + " batch(es)";
    } catch (const Error& e) {
      in.problems.push_back(
          std::string(d.val_path.empty() ? "data.val_fraction: " : "data.val_path: ") + e.what());
    }
  }
  const CheckpointConfig& c = deck.checkpoint;
  const comm::Communicator world = comm::Communicator::world();
  const auto another_run = [&](const std::string& file,
                               const std::vector<train::IdentityDifference>& differences) {
    const std::string text = train::describe_differences(differences);
    if (c.allow_other_run)
      return file + " is another run's (" + text + "): resumed anyway (allow_other_run)";
    in.problems.push_back("checkpoint.resume: " + file + " is another run's: " + text +
                          " (docs/reliability.md#whose-checkpoint)");
    return file + " is another run's";
  };
  try {
    if (c.resume == "none") {
      const int same = train::check_checkpoint_dir(deck, world);
      in.checkpoints = "from step 0 into " + c.dir +
                       (same > 0 ? " (replacing " + std::to_string(same) +
                                       " checkpoint(s) of an earlier run of this deck)"
                                 : std::string());
    } else if (c.resume == "auto") {
      const std::vector<std::string> found = train::checkpoints_newest_first(c.dir);
      if (found.empty()) {
        in.checkpoints = "resume = \"auto\": no checkpoint in " + c.dir + ", from step 0";
      } else {
        try {
          const auto differences = train::run_differences(found.front(), deck, world);
          in.checkpoints = "resume = \"auto\": " + (differences.empty()
                                                        ? "from " + found.front() + ", this run's"
                                                        : another_run(found.front(), differences));
        } catch (const Error& e) {
          if (!e.collective())
            throw;
          // Damaged: train steps over it to the next older one.
          in.checkpoints = "resume = \"auto\": the newest, " + found.front() +
                           ", cannot be read (train would try the older ones): " + e.what();
        }
      }
    } else {
      const auto differences = train::run_differences(c.resume, deck, world);
      in.checkpoints =
          "resume from " + c.resume +
          (differences.empty() ? ", this run's" : ": " + another_run(c.resume, differences));
    }
  } catch (const Error& e) {
    if (!e.collective())
      throw;
    in.checkpoints = "cannot be used";
    in.problems.push_back(std::string("checkpoint: ") + e.what());
  }
  return in;
}

} // namespace

int run_check(const std::string& deck_path, const Environment& env, bool json,
              const std::string& machine_path) {
  const Deck deck = cost::load_deck(deck_path);
  const comm::Layout layout = comm::layout_of(deck.parallel);
  // On one process this is a dry check of the deck; under mpiexec the job
  // itself must fit the layout.
  if (env.world_size() > 1)
    layout.validate_for_world(env.world_size());
  // The planner's prediction for this layout (docs/planner.md), with a machine file.
  std::optional<io::Machine> machine;
  if (!machine_path.empty())
    machine = io::load_machine(machine_path);
  const Inputs inputs = check_inputs(deck);
  // One verdict, for one target: the machine file's devices when one is given, else the
  // ranks of this job where it runs (what `cubelm train` here would decide:
  // docs/reliability.md#memory-admission).
  std::optional<cost::Prediction> prediction;
  std::string target, fit_reason;
  bool fits = true;
  std::optional<MemoryCheck> here;
  if (machine) {
    prediction = cost::predict(deck, *machine);
    target = machine->name + " (" + machine_path + ")";
    fits = prediction->fits;
    char gib[32];
    std::snprintf(gib, sizeof(gib), "%.4g", machine->memory_gib);
    fit_reason = format_bytes(static_cast<double>(prediction->memory.total())) + " per rank of " +
                 gib + " GiB per device";
  } else {
    here = check_memory(static_cast<std::uint64_t>(cost::estimate_memory(deck).total()));
    target = "this node";
    fits = here->fits;
    fit_reason = here->skipped
                     ? std::string("not checked (") + kSkipMemoryCheck + "=1)"
                     : "the fullest rank needs " + format_bytes(static_cast<double>(here->need)) +
                           " of " + format_bytes(static_cast<double>(here->available)) + " (" +
                           here->source + ", shared by " + std::to_string(here->sharing) + " rank" +
                           (here->sharing == 1 ? "" : "s") + ")";
  }
  const bool ok = fits && inputs.problems.empty();
  if (env.world_rank() != 0)
    return ok ? 0 : 1;
  if (json) {
    std::string text = check_json(deck, deck_path);
    text.pop_back(); // the object's closing brace
    if (prediction)
      text += ", \"prediction\": " + prediction_json(deck, *prediction);
    text += ", \"target\": " + json_text(target) + ", \"fits\": " + (fits ? "true" : "false") +
            ", \"fit\": " + json_text(fit_reason) + ", \"data\": " + json_text(inputs.data) +
            ", \"checkpoints\": " + json_text(inputs.checkpoints) + ", \"problems\": [";
    for (std::size_t i = 0; i < inputs.problems.size(); ++i)
      text += (i ? ", " : "") + json_text(inputs.problems[i]);
    text += "], \"ok\": " + std::string(ok ? "true" : "false") + "}";
    std::printf("%s\n", text.c_str());
    return ok ? 0 : 1;
  }
  std::printf("%s: valid deck\n%s", deck_path.c_str(), describe(deck).c_str());
  std::printf("data file  %s\ncheckpoint %s\n", inputs.data.c_str(), inputs.checkpoints.c_str());
  if (prediction)
    std::printf("%s", prediction_text(deck, *prediction, *machine).c_str());
  if (env.world_size() == 1 && layout.world_size() > 1)
    std::printf("launch     this deck needs %d processes (mpiexec -n %d)\n", layout.world_size(),
                layout.world_size());
  if (here && !here->skipped)
    std::printf("available  %s per rank (%s, shared by %d rank%s): the fullest rank needs %s, "
                "%s\n",
                format_bytes(static_cast<double>(here->available)).c_str(), here->source.c_str(),
                here->sharing, here->sharing == 1 ? "" : "s",
                format_bytes(static_cast<double>(here->need)).c_str(),
                here->fits ? "fits" : "does not fit: cubelm train would refuse it here");
  for (const std::string& problem : inputs.problems)
    std::printf("problem    %s\n", problem.c_str());
  std::printf("verdict    %s on %s: %s%s\n", ok ? "OK" : "NOT OK", target.c_str(),
              fits ? "fits" : "does NOT fit", (", " + fit_reason).c_str());
  if (!inputs.problems.empty())
    std::printf("           %zu input problem%s above\n", inputs.problems.size(),
                inputs.problems.size() == 1 ? "" : "s");
  return ok ? 0 : 1;
}

bool train_wants_mpi_threads(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "train")
      continue;
    for (int j = i + 1; j < argc; ++j)
      if (argv[j][0] != '-') {
        try {
          return cost::load_deck(argv[j]).checkpoint.async;
        } catch (const std::exception&) {
          return false;
        }
      }
    return false;
  }
  return false;
}

int run_train(const std::string& deck_path, const Environment& env) {
  const Deck deck = cost::load_deck(deck_path);
  comm::layout_of(deck.parallel).validate_for_world(env.world_size());
  return run_training(deck, std::cout);
}

int run_data(const DataOptions& o, const Environment& env) {
  // The command line's rules, checked on every rank alike.
  const auto refuse = [](const std::string& why) { throw Error("cubelm data: " + why, true); };
  if (!o.merges.empty() && o.vocab.empty())
    refuse("--merges " + o.merges + " goes with --vocab vocab.json");
  if (!(o.progress >= 0) || std::isinf(o.progress)) {
    std::ostringstream value;
    value << o.progress;
    refuse("--progress " + value.str() +
           ": must be a finite number of seconds >= 0 (0: no progress lines)");
  }
  if (!o.decode.empty()) {
    if (!o.inputs.empty())
      refuse("--decode " + o.decode + " takes no text files (" + o.inputs.front() +
             "): it writes the text of one token file");
  } else {
    if (o.inputs.empty())
      refuse("no text files to convert (cubelm data A.txt ... -o T.bin)");
    if (o.output.empty())
      refuse("no output file: -o T.bin");
    if (!o.bpe.empty() && o.vocab.empty())
      refuse("--bpe " + o.bpe +
             " needs --vocab FILE: the BPE's ranks as a .tiktoken file "
             "(r50k_base.tiktoken for gpt2) or Hugging Face's vocab.json, with merges.txt "
             "beside it");
    if (o.bpe.empty() && !o.vocab.empty())
      refuse("--vocab " + o.vocab + " needs --bpe gpt2 (without --bpe each byte is a token)");
  }
  // One writer: the file is made on rank 0 alone.
  if (env.world_rank() != 0)
    return 0;

  if (!o.decode.empty()) {
    std::optional<io::Bpe> bpe;
    if (!o.vocab.empty())
      bpe = io::Bpe::load(o.bpe.empty() ? "gpt2" : o.bpe, o.vocab, o.merges);
    const io::Bpe* vocabulary = bpe ? &*bpe : nullptr;
    if (o.output.empty()) {
      io::llmc_to_text(o.decode, vocabulary, std::cout);
      return 0;
    }
    std::ofstream file(o.output, std::ios::binary | std::ios::trunc);
    if (!file)
      throw Error(o.output + ": cannot create the file (does the directory exist and is it "
                             "writable?)");
    const std::int64_t count = io::llmc_to_text(o.decode, vocabulary, file);
    file.close();
    if (!file)
      throw Error(o.output + ": writing the file failed (is the disk full?)");
    std::printf("%s: the text of %lld tokens of %s (%s)\n", o.output.c_str(),
                static_cast<long long>(count), o.decode.c_str(),
                bpe ? bpe->source().c_str() : "byte vocabulary, 256");
    return 0;
  }

  if (o.bpe.empty()) {
    const std::int64_t count = io::text_to_llmc(o.inputs, o.output);
    std::printf("%s: %lld tokens (bytes of %zu text file%s, vocabulary 256)\n", o.output.c_str(),
                static_cast<long long>(count), o.inputs.size(), o.inputs.size() == 1 ? "" : "s");
    return 0;
  }
  const io::Bpe bpe = io::Bpe::load(o.bpe, o.vocab, o.merges);
  io::BpeRunOptions run;
  // Threads inherit the mask of the thread that starts them: give it the launcher's CPUs
  // back, which the OpenMP runtime may have narrowed to one.
  restore_launch_affinity();
  run.threads =
      o.threads > 0 ? o.threads : std::max<int>(1, static_cast<int>(launch_cpus().size()));
  if (o.progress > 0) {
    run.progress_seconds = o.progress;
    run.progress = [](const io::BpeProgress& p) {
      std::fprintf(stderr, "cubelm data: %sB of %sB (%.0f%%), %.1f MB/s\n",
                   si(static_cast<double>(p.bytes_done), 1).c_str(),
                   si(static_cast<double>(p.bytes_total), 1).c_str(),
                   p.bytes_total > 0 ? 100.0 * p.bytes_done / p.bytes_total : 100.0,
                   p.bytes_done / 1e6 / std::max(p.seconds, 1e-9));
      std::fflush(stderr);
    };
  }
  const io::BpeRunResult r = io::bpe_text_to_llmc(bpe, o.inputs, o.output, run);
  std::printf("%s: %lld tokens (GPT-2 BPE of %zu text file%s, %sB; vocabulary %d, "
              "<|endoftext|> %d between files; %.1f MB/s on %d thread%s)\n",
              o.output.c_str(), static_cast<long long>(r.tokens), o.inputs.size(),
              o.inputs.size() == 1 ? "" : "s", si(static_cast<double>(r.bytes), 1).c_str(),
              bpe.id_limit(), bpe.end_of_text(), r.bytes / 1e6 / std::max(r.seconds, 1e-9),
              run.threads, run.threads == 1 ? "" : "s");
  return 0;
}

int run_init(const std::string& deck_path, const std::string& output, const Environment& env) {
  const Deck deck = cost::load_deck(deck_path);
  comm::layout_of(deck.parallel).validate_for_world(env.world_size());
  // Parameters depend only on (seed, name, index): one micro-batch row of activations suffices.
  const model::GridModel<real> net(deck.model, deck.micro_batch(),
                                   static_cast<std::uint64_t>(deck.train.seed),
                                   comm::layout_of(deck.parallel), comm::Communicator::world());
  const std::vector<kernels::Vec<real>>* zeros = nullptr; // the moments: zeros
  train::save_checkpoint(output, deck, *net.model, zeros, zeros, 0, comm::Communicator::world());
  if (env.world_rank() == 0)
    std::printf("%s: step-0 checkpoint of %s (%.3g M parameters, seed %lld)\n", output.c_str(),
                deck_path.c_str(), cost::parameter_count(deck.model) / 1e6,
                static_cast<long long>(deck.train.seed));
  return 0;
}

int run_verify(const std::vector<std::string>& files, const Environment& env) {
  int damaged = 0;
  const comm::Communicator world = comm::Communicator::world();
  for (const std::string& file : files) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) { // every rank sees the same file system
      ++damaged;
      if (env.world_rank() == 0)
        std::printf("%s: no such file\n", file.c_str());
      continue;
    }
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
