#include "cubelm/train/trainer.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/io/synthetic.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/optim.hpp"
#include "cubelm/model/shape.hpp"
#include "cubelm/train/checkpointing.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cubelm::train {

double learning_rate(const OptimizerConfig& opt, int steps, int step) {
  if (step < opt.warmup_steps)
    return opt.lr * (step + 1) / opt.warmup_steps;
  // As llm.c: the decay ratio runs over [0, 1) for steps warmup .. steps-1.
  const int decay_steps = steps - opt.warmup_steps;
  if (decay_steps <= 0)
    return opt.lr;
  const double progress = static_cast<double>(step - opt.warmup_steps) / decay_steps;
  const double pi = 3.141592653589793;
  return opt.min_lr + 0.5 * (opt.lr - opt.min_lr) * (1.0 + std::cos(pi * std::min(1.0, progress)));
}

namespace {

std::string si(double x, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T"};
  int p = 0;
  while (std::fabs(x) >= 1000.0 && p < 4) {
    x /= 1000.0;
    ++p;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.1f%s%s", x, prefix[p], unit);
  return buf;
}

} // namespace

std::string format_step(const StepMetrics& m, int steps) {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "step %d/%d | loss %.4f | gnorm %.2f | lr %.1e | %.0f ms | %s tok/s | %.1f "
                "GFLOP/s/rank | MFU %.0f%% | mem %.0f MiB/rank",
                m.step, steps, m.loss, m.grad_norm, m.lr, m.ms, si(m.tokens_per_s, "").c_str(),
                m.gflops_per_rank, 100.0 * m.mfu, m.mem_bytes / 1048576.0);
  return buf;
}

std::string format_json(const StepMetrics& m) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"step\": " << m.step << ", \"loss\": " << m.loss << ", \"grad_norm\": " << m.grad_norm
      << ", \"lr\": " << m.lr << ", \"ms\": " << m.ms << ", \"tokens_per_s\": " << m.tokens_per_s
      << ", \"gflops_per_rank\": " << m.gflops_per_rank << ", \"mfu\": " << m.mfu
      << ", \"mem_bytes\": " << m.mem_bytes << ", \"comm_bytes\": " << m.comm_bytes
      << ", \"wait_ms\": " << m.wait_ms << ", \"comm\": {";
  bool first = true;
  for (const auto& e : m.traffic) {
    if (e.calls == 0)
      continue;
    out << (first ? "" : ", ") << "\"" << e.group << "." << comm::kind_name(e.kind)
        << "\": {\"calls\": " << e.calls << ", \"bytes\": " << e.bytes << "}";
    first = false;
  }
  out << "}}";
  return out.str();
}

double measure_gemm_gflops() {
  const int n = 512;
  kernels::Mat<real> a("a", n, n), b("b", n, n), c("c", n, n);
  Kokkos::deep_copy(a, real(0.5));
  Kokkos::deep_copy(b, real(0.25));
  const ExecSpace exec;
  kernels::gemm<real>(exec, false, false, 1, a, b, 0, c); // warm-up
  exec.fence();
  Kokkos::Timer timer;
  int reps = 0;
  do {
    kernels::gemm<real>(exec, false, false, 1, a, b, 0, c);
    exec.fence();
    ++reps;
  } while (timer.seconds() < 0.2 || reps < 3);
  return 2.0 * n * n * static_cast<double>(n) * reps / timer.seconds() / 1e9;
}

namespace {
// Sequence parallelism is not part of this version; a deck asking for it is
// refused rather than run without it.
comm::Layout trainable(const Deck& deck) {
  if (deck.parallel.sequence_parallel)
    throw Error(deck.source + ": parallel.sequence_parallel = true: this version has no "
                              "sequence parallelism; set it to false",
                true);
  return comm::layout_of(deck.parallel);
}

int stage_of(const Deck& deck, const comm::Communicator& comm) {
  return comm::coords_of(trainable(deck), comm.rank()).pp;
}
} // namespace

Trainer::Trainer(const Deck& deck, const comm::Communicator& comm)
    : deck_(deck), comm_(comm), plan_(plan::make_plan(deck.parallel, deck.model)),
      timeline_(plan::simulate(plan_)), stage_(plan_, stage_of(deck, comm)),
      net_(deck.model, deck.micro_batch(), static_cast<std::uint64_t>(deck.train.seed),
           trainable(deck), comm, stage_.layout(deck.parallel.recompute == Recompute::full)) {
  const DataConfig& d = deck.data;
  const ModelConfig& m = deck.model;
  if (d.format == "synthetic") {
    tokens_ = io::make_synthetic_corpus(m.vocab_size, d.synthetic_tokens, d.synthetic_branching,
                                        static_cast<std::uint64_t>(deck.train.seed));
    floor_ = io::synthetic_entropy_floor(d.synthetic_branching);
  } else {
    tokens_ = io::load_tokens(d.format, d.path, m.vocab_size).tokens;
  }
  sampler_ = io::make_sampler(d.sampler, static_cast<std::int64_t>(tokens_.size()),
                              deck.train.global_batch, m.seq_len,
                              static_cast<std::uint64_t>(deck.train.seed));
  // Data-parallel replicas hold the same blocks: the first writes them.
  if (net_.grid->dp().rank() != 0)
    for (auto& p : net_.model->params())
      p.writer = false;
  dp_ = std::make_unique<DataParallel>(*net_.model, *net_.grid, deck.parallel.bucket_mb * 1e6,
                                       deck.parallel.zero == 1);
  batches_.resize(static_cast<std::size_t>(deck.parallel.microbatches));
  peak_gflops_ = deck.log.peak_gflops;
}

Trainer::~Trainer() = default;

model::Memory Trainer::memory() const {
  model::Memory mem = net_.model->memory();
  mem.optimizer = dp_->optimizer_bytes();
  return mem;
}

void Trainer::save(const std::string& path) const {
  const auto m = dp_->moments(0), v = dp_->moments(1);
  save_checkpoint(path, deck_, *net_.model, &m, &v, step_, comm_);
}

void Trainer::resume(const std::string& path) {
  // Whole blocks for the reader; each rank then keeps its own part.
  std::vector<kernels::Vec<real>> m, v;
  for (const auto& p : net_.model->params()) {
    m.emplace_back("cubelm::moment", p.size());
    v.emplace_back("cubelm::moment", p.size());
  }
  step_ = load_checkpoint(path, *net_.model, m, v, comm_);
  dp_->set_moments(m, v);
}

StepMetrics Trainer::step() {
  Kokkos::Timer timer;
  const int micro = deck_.micro_batch();
  const int seq = deck_.model.seq_len;
  const int count = deck_.parallel.microbatches;
  const double tokens = static_cast<double>(deck_.train.global_batch) * seq;
  model::ShardedGPT<real>& model = *net_.model;
  const comm::ProcessGrid& grid = *net_.grid;
  const comm::TrafficCounters& traffic = grid.traffic();
  const std::vector<comm::TrafficEntry> before = traffic.entries();
  // Micro-batch k of data-parallel rank d: rows (d m + k) micro of the global batch.
  const int d = grid.coords().dp;
  for (int k = 0; k < count; ++k)
    sampler_->fill_rows(tokens_, step_, (d * count + k) * micro, micro,
                        batches_[static_cast<std::size_t>(k)]);
  model.zero_grad();
  dp_->start_step();
  const PipelineStage::Result run =
      stage_.run(model, grid, batches_, 1.0 / tokens, [&](int unit) { dp_->unit_done(unit); });
  dp_->finish();
  // The loss (from the last stage, once per tensor-parallel group) and the squared
  // gradient norm (each element once), summed over the world.
  sums_(0) = model.stage().last && grid.tp().rank() == 0 ? run.loss_sum : 0.0;
  sums_(1) = dp_->sum_squares();
  if (grid.world().size() > 1)
    grid.world().all_reduce(HostExecSpace(), sums_);
  StepMetrics m;
  m.step = step_;
  m.loss = sums_(0) / tokens;
  m.grad_norm = std::sqrt(sums_(1));
  m.lr = learning_rate(deck_.optimizer, deck_.train.steps, step_);
  const OptimizerConfig& o = deck_.optimizer;
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  const double clip = o.grad_clip > 0 ? o.grad_clip / (m.grad_norm + 1e-6) : 1.0;
  if (clip < 1.0)
    dp_->scale(static_cast<real>(clip));
  kernels::AdamW hp;
  hp.lr = m.lr;
  hp.beta1 = o.beta1;
  hp.beta2 = o.beta2;
  hp.eps = o.eps;
  hp.weight_decay = o.weight_decay;
  hp.step = step_ + 1;
  dp_->update(hp);
  m.traffic = traffic.entries();
  for (auto& e : m.traffic) // this step's share: subtract what was counted before it
    for (const auto& b : before)
      if (b.group == e.group && b.kind == e.kind) {
        e.calls -= b.calls;
        e.bytes -= b.bytes;
      }
  for (const auto& e : m.traffic)
    m.comm_bytes += e.bytes;
  m.ms = timer.seconds() * 1e3;
  m.wait_ms = run.wait_s * 1e3;
  m.tokens_per_s = tokens / timer.seconds();
  // The model's FLOPs are shared by all ranks of the layout.
  m.gflops_per_rank = model::flops_per_token(deck_.model) * m.tokens_per_s / 1e9 /
                      comm::layout_of(deck_.parallel).world_size();
  m.mfu = peak_gflops_ > 0 ? m.gflops_per_rank / peak_gflops_ : 0.0;
  m.mem_bytes = memory().total();
  ++step_;
  return m;
}

namespace {

// The checkpoint named by checkpoint.resume, or "" to start from step 0.
std::string resume_file(const Deck& deck) {
  const std::string& resume = deck.checkpoint.resume;
  if (resume == "none")
    return "";
  if (resume == "auto")
    return latest_checkpoint(deck.checkpoint.dir);
  return resume;
}

} // namespace

int run_training(const Deck& deck, std::ostream& out) {
  Trainer trainer(deck);
  std::ostringstream discard; // only world rank 0 prints
  std::ostream& say = trainer.is_root() ? out : discard;
  double peak = deck.log.peak_gflops;
  if (peak <= 0)
    peak = measure_gemm_gflops();
  trainer.set_peak_gflops(peak);
  char line[320];
  std::snprintf(line, sizeof(line),
                "cubelm train: %s, %.3g M parameters, peak %.1f GFLOP/s/rank (%s)\n",
                deck.source.c_str(), model::parameter_count(deck.model) / 1e6, peak,
                deck.log.peak_gflops > 0 ? "from the deck" : "measured sgemm");
  say << line;
  if (trainer.entropy_floor() >= 0) {
    std::snprintf(line, sizeof(line),
                  "synthetic corpus: %lld tokens, entropy floor %.4f nats/token (ln %d)\n",
                  static_cast<long long>(deck.data.synthetic_tokens), trainer.entropy_floor(),
                  deck.data.synthetic_branching);
    say << line;
  }
  const model::Memory mem = trainer.memory();
  std::snprintf(line, sizeof(line),
                "memory per rank: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
                "activations %.2f MiB\n",
                mem.parameters / 1048576.0, mem.gradients / 1048576.0, mem.optimizer / 1048576.0,
                mem.activations / 1048576.0);
  say << line;
  const plan::PipelinePlan& plan = trainer.plan();
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
  if (deck.parallel.data_size > 1) {
    std::snprintf(line, sizeof(line),
                  "data parallel: %d replicas, %s, %d gradient bucket(s) on rank 0\n",
                  deck.parallel.data_size,
                  deck.parallel.zero ? "ZeRO-1 (optimizer state sharded)" : "optimizer replicated",
                  trainer.data_parallel().buckets());
    say << line;
  }
  const std::string from = resume_file(deck);
  if (!from.empty()) {
    trainer.resume(from);
    say << "resumed from " << from << " after step " << trainer.steps_done() << "\n";
  } else if (deck.checkpoint.resume == "auto") {
    say << "no checkpoint in " << deck.checkpoint.dir << ": starting from step 0\n";
  }
  std::ofstream metrics;
  if (!deck.log.metrics.empty() && trainer.is_root()) {
    // A resumed run appends to the metrics of the run it continues.
    metrics.open(deck.log.metrics, from.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics)
      throw Error("log.metrics = \"" + deck.log.metrics + "\": cannot open the file for writing",
                  true);
  }
  const int steps = deck.train.steps;
  const int interval = deck.checkpoint.interval;
  auto save = [&](int done) {
    const std::string path = checkpoint_path(deck.checkpoint.dir, done);
    trainer.save(path);
    prune_checkpoints(deck.checkpoint.dir, deck.checkpoint.keep);
    say << "checkpoint " << path << "\n" << std::flush;
  };
  StepMetrics last;
  double total_ms = 0, wait_ms = 0;
  const int first = trainer.steps_done();
  for (int s = first; s < steps; ++s) {
    last = trainer.step();
    total_ms += last.ms;
    wait_ms += last.wait_ms;
    if (metrics.is_open())
      metrics << format_json(last) << "\n" << std::flush;
    if (s % deck.log.interval == 0 || s + 1 == steps)
      say << format_step(last, steps) << "\n" << std::flush;
    if (interval > 0 && (s + 1) % interval == 0 && s + 1 < steps)
      save(s + 1);
  }
  if (steps > first) {
    save(steps);
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
    say << "communication of rank 0 over " << steps - first
        << " steps (modelled bytes sent, docs/communication.md):\n";
    for (const auto& e : trainer.traffic().entries())
      if (e.calls > 0) {
        std::snprintf(line, sizeof(line), "  %-8s %-15s %8llu calls %14.0f bytes\n",
                      e.group.c_str(), comm::kind_name(e.kind),
                      static_cast<unsigned long long>(e.calls), e.bytes);
        say << line;
      }
    std::snprintf(line, sizeof(line), "done: %d steps in %.1f s, final loss %.4f", steps - first,
                  total_ms / 1e3, last.loss);
    say << line;
    if (trainer.entropy_floor() >= 0) {
      std::snprintf(line, sizeof(line), " (floor %.4f, %.4f above it)", trainer.entropy_floor(),
                    last.loss - trainer.entropy_floor());
      say << line;
    }
    say << "\n";
  }
  return 0;
}

} // namespace cubelm::train
