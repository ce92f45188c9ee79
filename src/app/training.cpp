#include "cubelm/app/training.hpp"

#include "cubelm/comm/communicator.hpp"
#include "cubelm/comm/layout.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/memory_check.hpp"
#include "cubelm/core/memory_info.hpp"
#include "cubelm/core/peak.hpp"
#include "cubelm/core/stop.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/train/checkpointing.hpp"
#include "cubelm/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

namespace cubelm::app {

void admit_memory(const Deck& deck) {
  const comm::Layout layout = comm::layout_of(deck.parallel);
  const int rank = comm::Communicator::world().rank();
  const int stage = comm::coords_of(layout, rank).pp;
  const cost::Memory mine = cost::estimate_memory(deck, stage);
  // On CPUs the host buffers of background checkpoints share the memory checked.
  constexpr bool on_gpu = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;
  const std::int64_t host = on_gpu ? 0 : mine.checkpoint_buffers + mine.writer_slabs;
  const MemoryCheck check = check_memory(static_cast<std::uint64_t>(mine.total() + host));
  if (check.skipped || check.fits)
    return;
  // The numbers of the rank with the least room, the same on every rank.
  const int worst_stage = comm::coords_of(layout, check.rank).pp;
  const cost::Memory need = cost::estimate_memory(deck, worst_stage);
  const ParallelConfig& p = deck.parallel;
  std::string keys = "raise parallel.tensor_size (tensor_mode), parallel.pipeline_size";
  if (p.recompute != Recompute::full)
    keys += ", set parallel.recompute = \"full\"";
  if (p.data_size * p.context_size > 1 && p.zero == 0)
    keys += ", set parallel.zero = 1";
  if (deck.model.seq_len % (4 * p.context_size) == 0) // a doubled context_size fits
    keys += ", raise parallel.context_size (long sequences)";
  if (deck.micro_batch() > 1)
    keys += ", lower the micro-batch size (" + std::to_string(deck.micro_batch()) +
            " = train.global_batch / (parallel.data_size x parallel.microbatches): lower "
            "train.global_batch or raise parallel.microbatches)";
  char reserve[32];
  std::snprintf(reserve, sizeof(reserve), "%.0f%%", 100.0 * kMemoryReserve);
  throw Error(
      deck.source + ": not enough memory: rank " + std::to_string(check.rank) +
          " (pipeline stage " + std::to_string(worst_stage) + ") needs " +
          format_bytes(static_cast<double>(check.need)) + " (parameters " +
          format_bytes(static_cast<double>(need.parameters)) + ", gradients " +
          format_bytes(static_cast<double>(need.gradients)) + ", optimizer " +
          format_bytes(static_cast<double>(need.optimizer)) + ", activations " +
          format_bytes(static_cast<double>(need.activations)) +
          (host > 0 && need.checkpoint_buffers > 0
               ? ", checkpoint buffers " +
                     format_bytes(static_cast<double>(need.checkpoint_buffers)) +
                     " (checkpoint.async)"
               : std::string()) +
          (host > 0 && need.writer_slabs > 0
               ? ", the checkpoint writer's buffers " +
                     format_bytes(static_cast<double>(need.writer_slabs))
               : std::string()) +
          ") but " + format_bytes(static_cast<double>(check.available)) + " is available to it (" +
          check.source + ", shared by " + std::to_string(check.sharing) + " rank" +
          (check.sharing == 1 ? "" : "s") + "; " + reserve + " kept for the runtime leaves " +
          format_bytes(static_cast<double>(check.usable)) + "). To need less per rank: " + keys +
          ". " + kSkipMemoryCheck + "=1 skips this check.",
      true);
}

namespace {

// Test hook: CUBELM_TEST_STEP_PAUSE_MS=<ms> sleeps that long after every step, so that a
// test of the batch system's signals gets a run that lasts without keeping the cores busy
// (docs/reliability.md). 0 when unset; a value that is not a whole number from 0 to 60000
// is an error naming the variable.
int step_pause_ms() {
  const char* env = std::getenv("CUBELM_TEST_STEP_PAUSE_MS");
  if (env == nullptr || *env == '\0')
    return 0;
  char* end = nullptr;
  const long ms = std::strtol(env, &end, 10);
  if (*end != '\0' || ms < 0 || ms > 60000)
    throw Error(std::string("CUBELM_TEST_STEP_PAUSE_MS = \"") + env +
                    "\": not a whole number of milliseconds from 0 to 60000",
                true);
  return static_cast<int>(ms);
}

// "SIGUSR1 on 1 rank", "the time limit", ... for the stop message.
std::string stop_reason(const train::StopVotes& votes) {
  std::string out;
  const auto add = [&](int ranks, const std::string& what) {
    if (ranks == 0)
      return;
    out += (out.empty() ? "" : ", ") + what + " on " + std::to_string(ranks) + " rank" +
           (ranks == 1 ? "" : "s");
  };
  add(votes.sigterm, "SIGTERM");
  add(votes.sigusr1, "SIGUSR1");
  add(votes.deadline, "too little time left before the deadline");
  return out;
}

} // namespace

int run_training(const Deck& deck, std::ostream& out) {
  const auto clock_start = std::chrono::steady_clock::now();
  // From here on SIGTERM and SIGUSR1 ask for a checkpoint and a clean stop.
  const StopSignals signals;
  admit_memory(deck);
  train::Trainer trainer(deck);
  std::ostringstream discard; // only world rank 0 prints
  std::ostream& say = trainer.is_root() ? out : discard;
  const int threads = static_cast<int>(Kokkos::DefaultHostExecutionSpace().concurrency());
  constexpr bool on_gpu = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;
  std::string peak_from = "from the deck";
  double peak = deck.log.peak_gflops;
  double share = 1;
  int measured_threads = 1;
  if (peak <= 0) {
    // The node's sgemm rate with no other rank running, times this rank's share of
    // the node (core/peak.hpp): an MFU of the machine, never above 100%.
    const NodePeak node = measure_node_peak(kernels::measure_gemm_gflops, threads);
    peak = node.per_rank();
    share = node.share();
    measured_threads = node.threads;
    char how[200];
    if (on_gpu)
      std::snprintf(how, sizeof(how), "%s gemm %.1f GFLOP/s alone on the GPU",
                    precision_name(deck.train.precision), node.alone);
    else
      std::snprintf(how, sizeof(how), "sgemm %.1f GFLOP/s alone on the node, %d thread%s",
                    node.alone, threads, threads == 1 ? "" : "s");
    peak_from = how;
    if (node.share() < 1) {
      std::snprintf(how, sizeof(how), " x %.3g: %d ranks x %d threads on %d CPUs", node.share(),
                    node.ranks, node.threads, node.cpus);
      peak_from += how;
    }
  }
  trainer.set_peak_gflops(peak, share, measured_threads);
  // The products' library: cuBLAS on a GPU; on CPUs the BLAS, its threads and kernels.
  const std::string threading = kernels::blas_threading(),
                    kernels_note = kernels::blas_kernel_decision().note;
  const std::string blas = on_gpu ? std::string("cuBLAS")
                           : kernels_note.rfind(threading, 0) == 0
                               ? kernels_note
                               : threading + ", " + kernels_note;
  char line[480];
  std::snprintf(line, sizeof(line),
                "cubelm train: %s, %.3g M parameters, peak %.1f GFLOP/s/rank (%s; %s)\n",
                deck.source.c_str(), cost::parameter_count(deck.model) / 1e6, peak,
                peak_from.c_str(), blas.c_str());
  say << line;
  if (threads > 1 && kernels::blas_has_own_threads())
    say << "warning: the BLAS (" << kernels::blas_threading()
        << ") starts threads of its own beside Kokkos' " << threads
        << " OpenMP threads: they compete for the cores. Use OpenBLAS built for OpenMP "
           "(docs/launching.md#blas-threads)\n";
  if (trainer.entropy_floor() >= 0) {
    std::snprintf(line, sizeof(line),
                  "synthetic corpus: %lld tokens, entropy floor %.4f nats/token (ln %d)\n",
                  static_cast<long long>(deck.data.synthetic_tokens), trainer.entropy_floor(),
                  deck.data.synthetic_branching);
    say << line;
  }
  const cost::Memory mem = trainer.memory();
  std::snprintf(line, sizeof(line),
                "memory per rank: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
                "activations %.2f MiB\n",
                mem.parameters / 1048576.0, mem.gradients / 1048576.0, mem.optimizer / 1048576.0,
                mem.activations / 1048576.0);
  say << line;
  const pipeline::PipelinePlan& plan = trainer.plan();
  if (plan.stages > 1 || plan.chunks > 1 || deck.parallel.microbatches > 1) {
    std::string idle, held;
    for (int s = 0; s < plan.stages; ++s) {
      std::snprintf(line, sizeof(line), "%s%.3f", s ? " " : "", trainer.timeline().bubble(s));
      idle += line;
      held += (s ? " " : "") +
              std::to_string(trainer.timeline().peak_in_flight[static_cast<std::size_t>(s)]);
    }
    std::snprintf(line, sizeof(line),
                  "pipeline: %s, %d stage(s) x %d chunk(s), %d micro-batches; idle/busy per stage "
                  "(unit-cost model) %s; activation sets held per stage %s\n",
                  schedule_name(plan.schedule), plan.stages, plan.chunks, plan.micro, idle.c_str(),
                  held.c_str());
    say << line;
  }
  const int replicas = deck.parallel.data_size * deck.parallel.context_size;
  if (replicas > 1) {
    // With context parallelism the cp ranks of a sequence hold replicas too.
    std::snprintf(line, sizeof(line),
                  "data parallel: %d replicas%s, %s, %d gradient bucket(s) on rank 0\n", replicas,
                  deck.parallel.context_size > 1 ? " (data x context)" : "",
                  deck.parallel.zero ? "ZeRO-1 (optimizer state sharded)" : "optimizer replicated",
                  trainer.data_parallel().buckets());
    say << line;
  }
  if (trainer.validation_batches() > 0) {
    const DataConfig& d = deck.data;
    const io::TokenSplit& t = trainer.tokens();
    const std::string where = d.val_fraction > 0 ? "the last " + std::to_string(t.validation) +
                                                       " tokens of the corpus, held out (" +
                                                       std::to_string(t.train) + " train)"
                                                 : d.val_path;
    const std::string when =
        deck.eval.interval > 0
            ? "every " + std::to_string(deck.eval.interval) + " steps and at the end"
            : "at the end";
    std::snprintf(line, sizeof(line), "validation: %s, %d batch(es) of %d x %d tokens, %s\n",
                  where.c_str(), trainer.validation_batches(), deck.train.global_batch,
                  deck.model.seq_len, when.c_str());
    say << line;
  }
  std::string from;
  const std::string& resume = deck.checkpoint.resume;
  if (resume == "auto") {
    from =
        trainer.resume_newest(deck.checkpoint.dir, [&](const std::string&, const std::string& why) {
          say << "skipped: " << why << "\n";
        });
    if (from.empty())
      say << "no checkpoint in " << deck.checkpoint.dir << ": starting from step 0\n";
  } else if (resume != "none") {
    trainer.resume(resume);
    from = resume;
  } else if (const int earlier = trainer.check_checkpoint_dir(); earlier > 0) {
    say << "checkpoint.dir = " << deck.checkpoint.dir << " holds " << earlier
        << " checkpoint(s) of an earlier run of this deck (the same model, data and seed): "
           "this run starts from step 0 and writes over them as it reaches their steps\n";
  }
  if (!trainer.resume_note().empty())
    say << "note: " << trainer.resume_note() << "\n";
  if (!from.empty())
    say << "resumed from " << from << " after step " << trainer.steps_done() << "\n";
  std::ofstream metrics;
  if (!deck.log.metrics.empty() && trainer.is_root()) {
    // A resumed run appends to the metrics of the run it continues, without the
    // lines of the steps it repeats (written after the checkpoint it resumed from).
    if (!from.empty())
      train::drop_metrics_from(deck.log.metrics, trainer.steps_done());
    metrics.open(deck.log.metrics, from.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics)
      throw Error("log.metrics = \"" + deck.log.metrics + "\": cannot open the file for writing",
                  true);
  }
  const int steps = deck.train.steps;
  const int interval = deck.checkpoint.interval;
  const bool background = trainer.saves_in_background();
  if (!trainer.async_note().empty())
    say << "warning: " << trainer.async_note() << "\n";
  else if (background)
    say << "checkpoints: written in the background (checkpoint.async), "
        << format_bytes(static_cast<double>(mem.checkpoint_buffers)) << " of host buffers\n";
  int saved = -1;          // the step of the last checkpoint this run took
  double longest_save = 0; // seconds: a synchronous save, or a background write
  // A checkpoint that could not be written: the end of the run, or with
  // checkpoint.on_error = "warn" a warning while training goes on.
  auto failed = [&](const std::string& error, bool at_end) {
    if (deck.checkpoint.on_error != "warn" || at_end)
      throw Error(error, true);
    say << "warning: " << error << "; training goes on (checkpoint.on_error = \"warn\")\n"
        << std::flush;
  };
  // A background write that every rank has finished.
  auto written = [&](const train::BackgroundResult& r, bool at_end) {
    if (!r.error.empty())
      return failed(r.error, at_end);
    longest_save = std::max(longest_save, r.seconds);
    std::snprintf(line, sizeof(line), " (written in the background in %.2f s)", r.seconds);
    say << "checkpoint " << r.path << line << "\n" << std::flush;
  };
  auto prune_after = [&deck](int done) {
    return [dir = deck.checkpoint.dir, keep = deck.checkpoint.keep, done] {
      train::prune_checkpoints(dir, keep, done);
    };
  };
  // Takes the checkpoint after `done` steps; returns the milliseconds the loop spent
  // on it. Into `step` (the metrics of the step before; null at the end): the time spent
  // waiting for the background write in flight, and what became of it.
  auto save = [&](int done, bool at_end, train::StepMetrics* step) {
    Kokkos::Timer timer;
    const std::string path = train::checkpoint_path(deck.checkpoint.dir, done);
    if (const auto in_flight = trainer.finish_background_save()) {
      if (step) {
        step->checkpoint_wait_ms = timer.seconds() * 1e3;
        step->background = *in_flight;
      }
      written(*in_flight, false); // an earlier checkpoint's write, never the run's last
    }
    saved = done;
    if (background && !at_end) {
      trainer.save_in_background(path, prune_after(done));
      return timer.seconds() * 1e3;
    }
    try {
      trainer.save(path);
    } catch (const Error& e) {
      if (!e.collective()) // one rank's own failure: the job cannot agree on going on
        throw;
      failed(e.what(), at_end);
      return timer.seconds() * 1e3;
    }
    if (trainer.is_root())
      prune_after(done)();
    longest_save = std::max(longest_save, timer.seconds());
    say << "checkpoint " << path << "\n" << std::flush;
    return timer.seconds() * 1e3;
  };
  // A checkpoint holds the parameters and both AdamW moments in float32.
  const Deadline deadline(deck.train.time_limit_s, clock_start, end_time_from_environment(),
                          3.0 * sizeof(float) * cost::parameter_count(deck.model));
  if (deadline.limited())
    say << "time limit: " << deadline.describe() << "\n";
  train::StepMetrics last;
  double total_ms = 0, wait_ms = 0, longest_step = 0;
  // The steps' time splits added up (means over ranks, and largest rank), for the summary.
  train::TimeSplit split_sum;
  const int first = trainer.steps_done();
  const int pause_ms = step_pause_ms();
  if (pause_ms > 0)
    say << "test hook: pausing " << pause_ms
        << " ms after every step (CUBELM_TEST_STEP_PAUSE_MS)\n";
  bool stopped = false;
  bool told_peak_raised = false;
  std::optional<double> val_loss; // the last validation's, after step val_step
  int val_step = 0;
  for (int s = first; s < steps && !stopped; ++s) {
    // Votes to stop after this step: a signal received, or too little time left for
    // this step and a checkpoint after it (twice the longest step so far, to be safe).
    train::StopVotes vote;
    const int signal = StopSignals::received();
    vote.sigterm = signal == SIGTERM;
    vote.sigusr1 = signal == SIGUSR1;
    // The save at a stop may first wait for a background write: twice the longest.
    vote.deadline = deadline.too_near(2 * longest_step +
                                      deadline.save_estimate((background ? 2 : 1) * longest_save));
    trainer.vote_stop(vote);
    last = trainer.step();
    total_ms += last.ms;
    wait_ms += last.wait_ms;
    train::accumulate(split_sum, last.time);
    stopped = last.stop.any() && s + 1 < steps;
    // Validation after every eval.interval steps and the last; not at a stop, which hurries.
    const int every = deck.eval.interval;
    if (!stopped && (s + 1 == steps || (every > 0 && (s + 1) % every == 0))) {
      Kokkos::Timer timer;
      last.val_loss = trainer.validate();
      last.val_ms = timer.seconds() * 1e3;
      if (last.val_loss) {
        val_loss = last.val_loss;
        val_step = s;
      }
    }
    longest_step = std::max(longest_step, (last.ms + last.val_ms) / 1e3);
    if (last.peak_raised && !told_peak_raised) {
      told_peak_raised = true;
      std::snprintf(line, sizeof(line),
                    "note: step %d ran at %.1f GFLOP/s/rank, above the peak: MFU is measured "
                    "against the fastest step from here on (docs/launching.md#mfu)\n",
                    last.step, last.gflops_per_rank);
      say << line;
    }
    if (s % deck.log.interval == 0 || s + 1 == steps || stopped || last.val_loss) {
      const int run = s + 1 - first;
      say << train::format_step(last, steps, total_ms / run * (steps - s - 1) / 1e3) << "\n"
          << std::flush;
    }
    if (!last.background.path.empty())
      written(last.background, false);
    // A checkpoint is taken only after a step that updated the model (docs/reliability.md).
    if (interval > 0 && (s + 1) % interval == 0 && s + 1 < steps && !stopped) {
      if (last.skipped)
        say << "no checkpoint after step " << s << ": it was skipped (non-finite)\n" << std::flush;
      else
        last.checkpoint_ms = save(s + 1, false, &last);
    }
    if (metrics.is_open())
      metrics << train::format_json(last) << "\n" << std::flush;
    if (pause_ms > 0 && !stopped)
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  if (steps > first) {
    if (saved != trainer.steps_done())
      save(trainer.steps_done(), true, nullptr);
    else if (const auto in_flight = trainer.finish_background_save())
      written(*in_flight, true);
    if (plan.stages > 1) {
      // Wall-clock share of the step each stage spent waiting for its neighbours.
      const comm::Group& pp = trainer.grid().pp();
      Kokkos::View<double*, Kokkos::HostSpace> mine("cubelm::wait", 1),
          all("cubelm::waits", pp.size());
      mine(0) = total_ms > 0 ? wait_ms / total_ms : 0.0;
      pp.all_gather(HostExecSpace(), mine, all);
      say << "waiting for other stages (wall clock, share of step time):";
      for (int s = 0; s < pp.size(); ++s) {
        std::snprintf(line, sizeof(line), " stage %d %.1f%%", s, 100.0 * all(s));
        say << line;
      }
      say << "\n";
    }
    say << train::format_time_split(split_sum, trainer.steps_done() - first);
    // Calls that sent nothing (a group of one rank) are left out.
    std::string rows;
    for (const auto& e : trainer.traffic())
      if (e.calls > 0 && e.bytes > 0) {
        std::snprintf(line, sizeof(line), "  %-8s %-15s %8llu calls %14.0f bytes\n",
                      e.group.c_str(), comm::kind_name(e.kind),
                      static_cast<unsigned long long>(e.calls), e.bytes);
        rows += line;
      }
    say << "communication of rank 0 over " << trainer.steps_done() - first << " steps"
        << (rows.empty() ? ": none (every group of this layout is one rank)\n"
                         : " (modelled bytes sent, docs/communication.md):\n" + rows);
    std::snprintf(line, sizeof(line), "%s: %d steps in %.1f s, final loss %.4f",
                  stopped ? "stopped" : "done", trainer.steps_done() - first, total_ms / 1e3,
                  last.loss);
    say << line;
    if (trainer.entropy_floor() >= 0) {
      std::snprintf(line, sizeof(line), " (floor %.4f, %.4f above it)", trainer.entropy_floor(),
                    last.loss - trainer.entropy_floor());
      say << line;
    }
    if (val_loss) {
      std::snprintf(line, sizeof(line), ", validation loss %.4f (after step %d)", *val_loss,
                    val_step);
      say << line;
    }
    say << "\n";
  }
  if (stopped) {
    say << "stopped early after step " << trainer.steps_done() - 1 << " of " << steps << " ("
        << stop_reason(last.stop) << "); the checkpoint "
        << train::checkpoint_path(deck.checkpoint.dir, trainer.steps_done())
        << " holds the state; exit status " << kExitStopped
        << ": run again with checkpoint.resume = \"auto\" to continue\n"
        << std::flush;
    return kExitStopped;
  }
  return 0;
}

} // namespace cubelm::app
