#include "cubelm/train/trainer.hpp"

#include "cubelm/comm/wait_time.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/io/synthetic.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/kernels/optim.hpp"
#include "cubelm/kernels/precision.hpp"
#include "cubelm/train/checkpointing.hpp"
#include "cubelm/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cubelm::train {

namespace {
// The hang watchdog's limit; until the first step, a hang is reported as before it.
double watchdog_timeout(const Deck& deck) {
  comm::watchdog::set_step(-1);
  comm::watchdog::set_micro_batch(-1);
  return deck.parallel.timeout_s;
}
} // namespace

Trainer::Trainer(const Deck& deck, const comm::Communicator& comm)
    : deck_(deck), comm_(comm), watchdog_(watchdog_timeout(deck)),
      plan_(pipeline::make_plan(deck.parallel, deck.model)), timeline_(pipeline::simulate(plan_)),
      stage_(plan_, comm::stage_of(deck.parallel, comm.rank())) {
  {
    const auto seed = static_cast<std::uint64_t>(deck.train.seed);
    const comm::Layout layout = comm::layout_of(deck.parallel);
    const cost::StageLayout stage = stage_.layout(deck.parallel.recompute == Recompute::full);
    if (deck.train.precision == Precision::bf16)
      net16_ = std::make_unique<model::GridModel<bf16>>(deck.model, deck.micro_batch(), seed,
                                                        layout, comm, stage);
    else
      net_ = std::make_unique<model::GridModel<real>>(deck.model, deck.micro_batch(), seed, layout,
                                                      comm, stage);
  }
  const DataConfig& d = deck.data;
  const ModelConfig& m = deck.model;
  if (d.format == "synthetic") {
    tokens_ = io::make_synthetic_corpus(m.vocab_size, d.synthetic_tokens, d.synthetic_branching,
                                        static_cast<std::uint64_t>(deck.train.seed));
    floor_ = io::synthetic_entropy_floor(d.synthetic_branching);
  } else {
    tokens_ = io::load_tokens(d.format, d.path, m.vocab_size).tokens;
  }
  // Held-out validation tokens: the corpus's tail (never sampled for training), or a file.
  if (!d.val_path.empty())
    val_tokens_ = io::load_tokens(d.format, d.val_path, m.vocab_size).tokens;
  split_ = io::split_tokens(deck, static_cast<std::int64_t>(tokens_.size()),
                            static_cast<std::int64_t>(val_tokens_.size()));
  if (d.val_fraction > 0) {
    val_tokens_.assign(tokens_.begin() + split_.train, tokens_.end());
    tokens_.resize(static_cast<std::size_t>(split_.train));
  }
  if (split_.batches > 0)
    val_sampler_ = std::make_unique<io::SequentialSampler>(
        static_cast<std::int64_t>(val_tokens_.size()), deck.train.global_batch, m.seq_len);
  sampler_ = io::make_sampler(d.sampler, static_cast<std::int64_t>(tokens_.size()),
                              deck.train.global_batch, m.seq_len,
                              static_cast<std::uint64_t>(deck.train.seed));
  // Data-parallel replicas hold the same blocks: the first writes them (for the experts,
  // the first of the ranks that hold the same experts). Under ZeRO, where each holds a
  // shard of their moments, each writes its shard (writes_moments).
  with_model([&](auto& model) {
    for (auto& p : model.params()) {
      p.writes_moments = p.writer;
      if ((p.expert ? grid().expert_dp() : grid().dp()).rank() != 0)
        p.writer = false;
    }
    dp_ = std::make_unique<DataParallel>(model, grid(), deck.parallel.bucket_mb * 1e6,
                                         deck.parallel.zero == 1);
  });
  batches_.resize(static_cast<std::size_t>(deck.parallel.microbatches));
  peak_gflops_ = deck.log.peak_gflops;
  for (const std::string& g : grid().group_names())
    if (g != "pp")
      comm_groups_.push_back(g);
  const std::size_t n = 3 + comm_groups_.size();
  split_mine_ = Kokkos::View<double*, Kokkos::HostSpace>("cubelm::time_split", n);
  split_all_ =
      Kokkos::View<double*, Kokkos::HostSpace>("cubelm::time_splits", n * grid().world().size());
  if (deck.checkpoint.async) {
    const std::string problem = comm::second_thread_problem(comm_);
    if (problem.empty()) {
      saves_ = std::make_unique<BackgroundSaves>(comm_);
      const auto runs = dp_->moment_runs(0);
      with_model([&](const auto& model) {
        saves_->snapshot().reserve(
            CheckpointSnapshot::bytes_for(model, dp_->zero() ? &runs : nullptr));
      });
    } else
      async_note_ = "checkpoint.async = true needs a writer thread that talks to MPI beside "
                    "training, but " +
                    problem + ": checkpoints are written synchronously";
  }
}

namespace {
// f(m, v) with the moments as a checkpoint takes them: under ZeRO this rank's own shards
// (runs of the blocks, which every rank writes: nothing is gathered), else whole blocks.
template <class F>
void with_moments(const DataParallel& dp, F&& f) {
  if (dp.zero())
    f(dp.moment_runs(0), dp.moment_runs(1));
  else
    f(dp.moments(0), dp.moments(1));
}
} // namespace

void Trainer::save_in_background(const std::string& path, std::function<void()> after_commit) {
  CUBELM_ASSERT(saves_ != nullptr, "Trainer::save_in_background: no background writer");
  CUBELM_ASSERT(!saves_->in_flight(), "Trainer::save_in_background: a write is in flight");
  with_moments(*dp_, [&](const auto& m, const auto& v) {
    with_model(
        [&](const auto& model) { saves_->snapshot().take(deck_, model, m, v, step_, updates_); });
  });
  saves_->start(path, comm_.rank() == 0 ? std::move(after_commit) : std::function<void()>());
}

namespace {

// A background write's result, the same on every rank: `failed` ranks' writes failed.
BackgroundResult agreed(BackgroundResult r, int failed) {
  if (r.error.empty() && failed > 0)
    r.error = "checkpoint " + r.path + ": the background write failed on " +
              std::to_string(failed) + " rank(s)";
  return r;
}

} // namespace

std::optional<BackgroundResult> Trainer::finish_background_save() {
  if (!saves_ || !saves_->in_flight())
    return std::nullopt;
  BackgroundResult r = saves_->wait();
  Kokkos::View<double*, Kokkos::HostSpace> failed("cubelm::save_failed", 1);
  failed(0) = r.error.empty() ? 0.0 : 1.0;
  if (grid().world().size() > 1) // on the uncounted group: no step's traffic
    grid().metrics().all_reduce(HostExecSpace(), failed);
  return agreed(std::move(r), static_cast<int>(failed(0)));
}

std::optional<double> Trainer::validate() {
  if (!val_sampler_)
    return std::nullopt;
  kernels::set_gemm_precision(deck_.train.precision);
  const int micro = deck_.micro_batch();
  const int count = deck_.parallel.microbatches;
  const comm::ProcessGrid& grid = this->grid();
  const std::vector<comm::TrafficEntry> before = grid.traffic().entries();
  comm::watchdog::set_step(step_);
  const int d = grid.coords().dp;
  const bool counts =
      with_model([](const auto& model) { return model.stage().last; }) && grid.tp().rank() == 0;
  Kokkos::View<double*, Kokkos::HostSpace> sum("cubelm::validation_loss", 1);
  for (int b = 0; b < split_.batches; ++b) {
    // The rows of the global batch a step would give this data-parallel rank.
    for (int k = 0; k < count; ++k)
      val_sampler_->fill_rows(val_tokens_, b, (d * count + k) * micro, micro,
                              batches_[static_cast<std::size_t>(k)]);
    const double loss = with_model(
        [&](auto& model) { return stage_.evaluate(ExecSpace(), model, grid, batches_); });
    if (counts)
      sum(0) += loss;
  }
  with_model([](auto& model) { model.take_aux_sum(); }); // not the next step's
  if (grid.world().size() > 1) // on the uncounted group: no step's traffic
    grid.metrics().all_reduce(HostExecSpace(), sum);
  for (const comm::TrafficEntry& e : grid.traffic().entries()) {
    comm::TrafficEntry mine = e;
    for (const comm::TrafficEntry& b : before)
      if (b.group == e.group && b.kind == e.kind) {
        mine.calls -= b.calls;
        mine.bytes -= b.bytes;
      }
    const auto it = std::find_if(val_traffic_.begin(), val_traffic_.end(), [&](const auto& v) {
      return v.group == e.group && v.kind == e.kind;
    });
    if (it == val_traffic_.end())
      val_traffic_.push_back(mine);
    else {
      it->calls += mine.calls;
      it->bytes += mine.bytes;
    }
  }
  return sum(0) /
         (static_cast<double>(split_.batches) * deck_.train.global_batch * deck_.model.seq_len);
}

std::vector<comm::TrafficEntry> Trainer::traffic() const {
  std::vector<comm::TrafficEntry> out = grid().traffic().entries();
  for (comm::TrafficEntry& e : out)
    for (const comm::TrafficEntry& v : val_traffic_)
      if (v.group == e.group && v.kind == e.kind) {
        e.calls -= v.calls;
        e.bytes -= v.bytes;
      }
  return out;
}

TimeSplit Trainer::split(double ms,
                         const std::vector<std::pair<std::string, double>>& waits_before) {
  const auto waited_ms = [&](const std::string& group) {
    double before = 0;
    for (const auto& [name, seconds] : waits_before)
      if (name == group)
        before = seconds;
    return (comm::wait_time::seconds(group) - before) * 1e3;
  };
  const std::size_t n = split_mine_.extent(0);
  double waits = 0;
  split_mine_(0) = ms;
  split_mine_(2) = waited_ms("pp");
  for (std::size_t g = 0; g < comm_groups_.size(); ++g) {
    split_mine_(3 + g) = waited_ms(comm_groups_[g]);
    waits += split_mine_(3 + g);
  }
  split_mine_(1) = ms - waits - split_mine_(2);
  grid().metrics().all_gather(HostExecSpace(), split_mine_, split_all_);
  const int ranks = grid().world().size();
  const auto spread = [&](std::size_t k) {
    Spread s{0, split_all_(k)};
    for (int r = 0; r < ranks; ++r) {
      const double x = split_all_(static_cast<std::size_t>(r) * n + k);
      s.mean += x / ranks;
      s.max = x > s.max ? x : s.max;
    }
    return s;
  };
  TimeSplit t;
  t.ms = spread(0);
  t.compute_ms = spread(1);
  t.idle_ms = spread(2);
  for (std::size_t g = 0; g < comm_groups_.size(); ++g)
    t.comm_ms.emplace_back(comm_groups_[g], spread(3 + g));
  return t;
}

Trainer::~Trainer() = default;

model::ShardedGPT<real>& Trainer::model() {
  CUBELM_ASSERT(net_ != nullptr, "Trainer::model(): this run's model stores bfloat16 "
                                 "(train.precision = \"bf16\"); its parameters are params()");
  return *net_->model;
}

std::vector<const tp::ParamBlock<real>*> Trainer::params() const {
  std::vector<const tp::ParamBlock<real>*> out;
  with_model([&](const auto& model) {
    for (const auto& p : model.params())
      out.push_back(&p);
  });
  return out;
}

cost::Memory Trainer::memory() const {
  cost::Memory mem = with_model([](const auto& model) { return model.memory(); });
  mem.optimizer = dp_->optimizer_bytes();
  if (saves_)
    mem.checkpoint_buffers = saves_->snapshot().bytes(); // reserved for this model
  return mem;
}

void Trainer::save(const std::string& path) const {
  with_moments(*dp_, [&](const auto& m, const auto& v) {
    with_model([&](const auto& model) {
      save_checkpoint(path, deck_, model, &m, &v, step_, comm_, updates_);
    });
  });
}

void Trainer::resume(const std::string& path) {
  resume_note_.clear();
  const std::vector<IdentityDifference> differences = run_differences(path, deck_, comm_);
  if (!differences.empty()) {
    const std::string text = describe_differences(differences);
    if (!deck_.checkpoint.allow_other_run)
      throw OtherRunCheckpoint(
          "checkpoint " + path + " is another run's: " + text +
              ". A run continues only from its own checkpoints (the same model, data, seed, "
              "global batch and precision; the steps, the optimizer's keys and the layout may "
              "change): give this run a checkpoint.dir of its own, or set "
              "checkpoint.allow_other_run = true to start from these weights anyway "
              "(docs/reliability.md#whose-checkpoint)",
          true);
    resume_note_ = "checkpoint " + path + " is another run's (" + text +
                   "): resumed from it anyway (checkpoint.allow_other_run = true)";
  }
  // Whole blocks for the reader; each rank then keeps its own part.
  std::vector<kernels::Vec<real>> m, v;
  for (const auto* p : params()) {
    m.emplace_back("cubelm::moment", p->size());
    v.emplace_back("cubelm::moment", p->size());
  }
  step_ =
      with_model([&](auto& model) { return load_checkpoint(path, model, m, v, comm_, &updates_); });
  bad_ = 0;
  dp_->set_moments(m, v);
}

std::string Trainer::resume_newest(
    const std::string& dir,
    const std::function<void(const std::string& file, const std::string& why)>& skipped) {
  const std::vector<std::string> found = checkpoints_newest_first(dir);
  for (const std::string& file : found) {
    try {
      // A load that fails part-way leaves some tensors read; the next one reads them all.
      resume(file);
      return file;
    } catch (const OtherRunCheckpoint&) {
      throw; // not damaged: the directory mixes runs, which an older file does not mend
    } catch (const Error& e) {
      if (!e.collective()) // only a refusal every rank shares can be stepped over together
        throw;
      skipped(file, e.what());
    }
  }
  if (!found.empty())
    throw Error("checkpoint.resume = \"auto\": none of the " + std::to_string(found.size()) +
                    " checkpoints in " + dir +
                    " can be loaded (each is named above); move the damaged files away, or set "
                    "checkpoint.resume = \"none\" to start from step 0",
                true);
  return "";
}

int Trainer::check_checkpoint_dir() const {
  return train::check_checkpoint_dir(deck_, comm_);
}

StepMetrics Trainer::step() {
  Kokkos::Timer timer;
  // The gemm precision is process-wide: this trainer's, whatever another one set.
  kernels::set_gemm_precision(deck_.train.precision);
  const int micro = deck_.micro_batch();
  const int seq = deck_.model.seq_len;
  const int count = deck_.parallel.microbatches;
  const double tokens = static_cast<double>(deck_.train.global_batch) * seq;
  const comm::ProcessGrid& grid = this->grid();
  const comm::TrafficCounters& traffic = grid.traffic();
  const std::vector<comm::TrafficEntry> before = traffic.entries();
  const std::vector<std::pair<std::string, double>> waits_before = comm::wait_time::all();
  comm::watchdog::set_step(step_);
  comm::watchdog::set_micro_batch(-1);
  // Micro-batch k of data-parallel rank d: rows (d m + k) micro of the global batch.
  const int d = grid.coords().dp;
  for (int k = 0; k < count; ++k)
    sampler_->fill_rows(tokens_, step_, (d * count + k) * micro, micro,
                        batches_[static_cast<std::size_t>(k)]);
  dp_->zero_grad();
  dp_->start_step();
  const PipelineStage::Result run = with_model([&](auto& model) {
    return stage_.run(ExecSpace(), model, grid, batches_, 1.0 / tokens,
                      [&](int unit) { dp_->unit_done(unit); });
  });
  const bool last_stage = with_model([](const auto& model) { return model.stage().last; });
  dp_->finish();
  // The loss (from the last stage, once per tensor-parallel group) and the squared
  // gradient norm (each element once), summed over the world.
  cost::StepSums sums;
  sums.loss = last_stage && grid.tp().rank() == 0 ? run.loss_sum : 0.0;
  sums.grad_squares = dp_->sum_squares();
  // Requests to stop after this step ride on the same reduction: no extra collective.
  sums.sigterm = vote_.sigterm ? 1.0 : 0.0;
  sums.sigusr1 = vote_.sigusr1 ? 1.0 : 0.0;
  sums.deadline = vote_.deadline ? 1.0 : 0.0;
  // The MoE layers' load-balancing loss (trained on, reported apart from the loss): each
  // rank's share of the tokens (the tensor-parallel ranks route a share each).
  sums.aux = with_model([](auto& model) { return model.take_aux_sum(); });
  // Whether this rank's background writer is done: when no rank's is, every rank takes
  // the result at this step.
  sums.save_pending = saves_ && saves_->running() ? 1.0 : 0.0;
  sums.save_failed = saves_ && saves_->failed() ? 1.0 : 0.0;
  vote_ = StopVotes{};
  const int n = cost::StepSums::count(deck_);
  sums.pack(sums_.data(), n);
  if (grid.world().size() > 1)
    grid.world().all_reduce(HostExecSpace(), Kokkos::subview(sums_, std::make_pair(0, n)));
  sums = cost::StepSums::unpack(sums_.data(), n);
  StepMetrics m;
  m.step = step_;
  m.loss = sums.loss / tokens;
  m.grad_norm = std::sqrt(sums.grad_squares);
  m.moe = deck_.model.experts > 1;
  m.aux_loss = sums.aux / tokens;
  m.stop.sigterm = static_cast<int>(sums.sigterm);
  m.stop.sigusr1 = static_cast<int>(sums.sigusr1);
  m.stop.deadline = static_cast<int>(sums.deadline);
  if (saves_ && saves_->in_flight() && sums.save_pending == 0)
    m.background = agreed(saves_->wait(), static_cast<int>(sums.save_failed));
  m.lr = learning_rate(deck_.optimizer, deck_.train.steps, step_);
  // The numeric guard: both sums are reduced over the world, so every rank sees the
  // same values and takes the same decision. A non-finite step leaves parameters
  // and moments as they are; the step counter (data, learning rate) moves on.
  m.skipped = !std::isfinite(m.loss) || !std::isfinite(m.grad_norm);
  if (!m.skipped) {
    const OptimizerConfig& o = deck_.optimizer;
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    const double clip = o.grad_clip > 0 ? o.grad_clip / (m.grad_norm + 1e-6) : 1.0;
    kernels::AdamW hp;
    hp.lr = m.lr;
    hp.beta1 = o.beta1;
    hp.beta2 = o.beta2;
    hp.eps = o.eps;
    hp.weight_decay = o.weight_decay;
    hp.step = updates_ + 1; // bias correction counts the updates the moments have seen
    dp_->update(hp, clip < 1.0 ? static_cast<real>(clip) : real(1));
    ++updates_;
    bad_ = 0;
  } else {
    ++bad_;
  }
  m.traffic = traffic.entries();
  for (auto& e : m.traffic) // this step's share: subtract what was counted before it
    for (const auto& b : before)
      if (b.group == e.group && b.kind == e.kind) {
        e.calls -= b.calls;
        e.bytes -= b.bytes;
      }
  for (const auto& e : m.traffic)
    m.comm_bytes += e.bytes;
  const double seconds = timer.seconds(); // one reading: tokens_per_s x ms is the step's tokens
  m.ms = seconds * 1e3;
  m.wait_ms = run.wait_s * 1e3;
  m.time = split(m.ms, waits_before);
  m.tokens_per_s = tokens / seconds;
  // The model's FLOPs are shared by all ranks of the layout.
  m.gflops_per_rank = cost::flops_per_token(deck_.model) * m.tokens_per_s / 1e9 /
                      comm::layout_of(deck_.parallel).world_size();
  // A peak is a rate no step can beat: one that does shows the peak was measured
  // low (a busy node, a deck's guess), and becomes the peak from here on.
  if (peak_gflops_ > 0 && m.gflops_per_rank > peak_gflops_) {
    peak_gflops_ = m.gflops_per_rank;
    m.peak_raised = true;
  }
  m.peak_gflops = peak_gflops_;
  m.peak_share = peak_share_;
  m.peak_threads = peak_threads_;
  m.mfu = peak_gflops_ > 0 ? std::min(1.0, m.gflops_per_rank / peak_gflops_) : 0.0;
  m.mem_bytes = memory().total();
  ++step_;
  if (bad_ >= deck_.train.max_bad_steps) {
    // "nan", never the sign of a NaN's bit pattern ("-nan").
    const auto text = [](double x) {
      char buf[32];
      if (std::isnan(x))
        return std::string("nan");
      std::snprintf(buf, sizeof(buf), "%g", x);
      return std::string(buf);
    };
    const std::string why = "loss " + text(m.loss) + ", gradient norm " + text(m.grad_norm);
    throw Error("step " + std::to_string(m.step) + ": " + why + ": " + std::to_string(bad_) +
                    " consecutive steps with a non-finite loss or gradient norm were skipped "
                    "(train.max_bad_steps = " +
                    std::to_string(deck_.train.max_bad_steps) +
                    "); training stops without a checkpoint of this state (parameters and "
                    "moments are those before step " +
                    std::to_string(m.step - bad_ + 1) +
                    "); lower optimizer.lr, set optimizer.grad_clip or check the data",
                true);
  }
  return m;
}

} // namespace cubelm::train
