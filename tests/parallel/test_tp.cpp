// Tensor-parallel equivalence: the model written against tp::Mode, on every
// rank of a 1D group, gives the single-process model's loss, and each rank's
// block of every parameter and gradient equals the same block of the
// single-process model's (the same code on MPI_COMM_SELF, itself checked against
// finite differences in test_model; double precision, and float within 1e-5).

#include "cubelm/cost/activations.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/traffic.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "test_helpers.hpp"
#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <unistd.h>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

ModelConfig tiny() {
  return cubelm::testing::tiny_model(32, 16, 8);
}

using cubelm::testing::host;
using cubelm::testing::random_tokens;

// The block [offset, offset + local) of a full row-major tensor.
template <class T>
std::vector<double>
block_of(const std::vector<double>& full, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& local) {
  const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
  const std::int64_t lcols = shape.size() == 2 ? local[1] : 1;
  const std::int64_t c0 = shape.size() == 2 ? offset[1] : 0;
  std::vector<double> out;
  for (std::int64_t r = 0; r < local[0]; ++r)
    for (std::int64_t c = 0; c < lcols; ++c)
      out.push_back(full[(offset[0] + r) * cols + c0 + c]);
  return out;
}

// The layouts of the whole world that the tests run: 1D at every size (and with
// sequence parallelism), 2D on a square, 3D on a cube.
std::vector<comm::Layout> layouts() {
  const int p = comm::Communicator::world().size();
  std::vector<comm::Layout> out;
  out.push_back(comm::Layout{1, 1, p, p == 1 ? TensorMode::none : TensorMode::d1});
  if (p > 1)
    out.push_back(comm::Layout{1, 1, p, TensorMode::d1, true});
  if (p == 4)
    out.push_back(comm::Layout{1, 1, p, TensorMode::d2});
  if (p == 8)
    out.push_back(comm::Layout{1, 1, p, TensorMode::d3});
  return out;
}

template <class T>
void check_equivalence(const comm::Layout& layout, double loss_tol, double grad_tol) {
  SCOPED_TRACE(layout.describe());
  const comm::ProcessGrid grid(layout, comm::Communicator::world());
  const ModelConfig c = tiny();
  const int batch = 4, n = batch * c.seq_len;
  const std::uint64_t seed = 77;
  auto single = model::GridModel<T>::single(c, batch, seed);
  auto& reference = *single.model;
  auto mode = tp::make_mode<T>(grid);
  model::ShardedGPT<T> sharded(c, batch, seed, *mode);
  ASSERT_STREQ(mode->name(), mode_name(layout.mode));

  const auto in = random_tokens(n, c.vocab_size, 1), tgt = random_tokens(n, c.vocab_size, 2);
  for (int pass = 0; pass < 2; ++pass) { // the second pass accumulates onto the first
    const double ref_loss = reference.forward_backward(ExecSpace(), in, tgt, 1.0 / n);
    const double loss = sharded.forward_backward(ExecSpace(), in, tgt, 1.0 / n);
    EXPECT_NEAR(loss, ref_loss, loss_tol * std::fabs(ref_loss));
  }

  double gmax = 0;
  for (const auto& p : reference.params())
    for (double g : host(p.grad))
      gmax = std::max(gmax, std::fabs(g));
  std::int64_t written = 0;
  for (const auto& p : sharded.params()) {
    SCOPED_TRACE(p.name);
    const auto& r = reference.param(p.name);
    ASSERT_EQ(p.shape, r.shape);
    const auto value = host(p.value), grad = host(p.grad);
    const auto rvalue = block_of<T>(host(r.value), p.shape, p.offset, p.local);
    const auto rgrad = block_of<T>(host(r.grad), p.shape, p.offset, p.local);
    ASSERT_EQ(value.size(), rvalue.size());
    for (std::size_t i = 0; i < value.size(); ++i) {
      ASSERT_EQ(value[i], rvalue[i]) << "initial value " << i; // layout-independent init
      ASSERT_NEAR(grad[i], rgrad[i], grad_tol * gmax) << "gradient " << i;
    }
    EXPECT_EQ(p.writer, p.counted);
    if (p.writer)
      written += static_cast<std::int64_t>(value.size());
  }
  EXPECT_EQ(sharded.params().size(), reference.params().size());
  // Across the group every element is written (and counted in the norm) exactly once.
  std::int64_t all = 0;
  MPI_Allreduce(&written, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  std::int64_t full = 0;
  for (const auto& p : reference.params())
    full += p.size();
  EXPECT_EQ(all, full);
}

} // namespace

TEST(TensorParallel, MatchesTheSingleProcessModelInDouble) {
  for (const auto& layout : layouts())
    check_equivalence<double>(layout, 1e-12, 1e-10);
}

TEST(TensorParallel, MatchesTheSingleProcessModelInFloat) {
  for (const auto& layout : layouts())
    check_equivalence<float>(layout, 1e-5, 1e-5);
}

namespace {

Deck train_deck(TensorMode mode, int tp, int microbatches = 1, bool sequence_parallel = false,
                Precision precision = Precision::fp32) {
  return DeckText()
      .set("train.precision", precision_name(precision))
      .set("model.heads", 8)
      .set("parallel.tensor_mode", mode_name(mode))
      .set("parallel.tensor_size", tp)
      .set("parallel.sequence_parallel", sequence_parallel)
      .set("parallel.microbatches", microbatches)
      .set("train.global_batch", 4 * microbatches)
      .set("train.seed", 3)
      .set("optimizer.lr", 1e-2)
      .set("optimizer.warmup_steps", 2)
      .set("data.synthetic_tokens", 5000)
      .deck("tp.toml");
}

Deck train_deck(const comm::Layout& layout, int microbatches = 1,
                Precision precision = Precision::fp32) {
  return train_deck(layout.mode, layout.tp, microbatches, layout.sequence_parallel, precision);
}

Deck single_deck() {
  return train_deck(TensorMode::none, 1);
}

using cubelm::testing::self;
using cubelm::testing::temp_path;

} // namespace

TEST(TensorParallel, TenAdamWStepsMatchTheSingleProcessRun) {
  for (const auto& layout : layouts()) {
    SCOPED_TRACE(layout.describe());
    train::Trainer group(train_deck(layout)), single(single_deck(), self());
    for (int s = 0; s < 10; ++s) {
      const auto a = group.step(), b = single.step();
      EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << "step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << "step " << s;
      if (layout.tp > 1)
        EXPECT_GT(a.comm_bytes, 0.0);
      else
        EXPECT_EQ(a.comm_bytes, 0.0);
    }
  }
}

// A run saved under the most parallel layout of this world (3D at 8 ranks, 2D at 4,
// 1D at 2) resumes under 1D on 2 ranks and on one process, with the same losses.
TEST(TensorParallel, CheckpointResumesUnderOtherLayouts) {
  const comm::Communicator world = comm::Communicator::world();
  const std::string path = temp_path("cubelm_test_tp_");
  const comm::Layout layout = layouts().back();
  SCOPED_TRACE(layout.describe());
  train::Trainer group(train_deck(layout));
  for (int s = 0; s < 3; ++s)
    group.step();
  group.save(path); // every rank writes its blocks; replicas write nothing
  std::vector<double> losses;
  for (int s = 3; s < 6; ++s)
    losses.push_back(group.step().loss);

  // 1D on the first two ranks.
  const bool pair = world.size() >= 2 && world.rank() < 2;
  const comm::Communicator two = world.split(pair ? 0 : 1, world.rank());
  if (pair) {
    train::Trainer oned(train_deck(TensorMode::d1, 2), two);
    oned.resume(path);
    EXPECT_EQ(oned.steps_done(), 3);
    for (int s = 3; s < 6; ++s)
      EXPECT_NEAR(oned.step().loss, losses[s - 3], 1e-4 * losses[s - 3]) << "1d, step " << s;
  }
  // The whole model on one process.
  if (world.rank() == 0) {
    train::Trainer single(single_deck(), self());
    single.resume(path);
    EXPECT_EQ(single.steps_done(), 3);
    for (int s = 3; s < 6; ++s)
      EXPECT_NEAR(single.step().loss, losses[s - 3], 1e-4 * losses[s - 3]) << "none, step " << s;
  }
  MPI_Barrier(world.raw());
  if (world.rank() == 0)
    std::filesystem::remove(path);
}

namespace {

// docs/communication.md: bytes each rank sends in one step, per (group, kind), for a
// deck with m micro-batches of N = micro T tokens. Activations, their gradients and the
// weights the kernels read are w bytes each (4 in fp32, 2 under bf16); gradients and
// statistics are float32 (4 bytes) in either; the loss sums are one double (8 bytes), the
// step's loss and squared norm two.
struct Volume {
  std::uint64_t calls = 0;
  double bytes = 0;
};
using Volumes = std::map<std::pair<std::string, comm::Kind>, Volume>;

Volumes closed_form(const Deck& deck) {
  using comm::Kind;
  const comm::Layout layout = comm::layout_of(deck.parallel);
  const double m = deck.parallel.microbatches, L = deck.model.layers, H = deck.model.hidden;
  const double V = static_cast<double>(tp::padded_vocab(deck.model, layout)),
               T = deck.model.seq_len; // the padded vocabulary
  const double N = static_cast<double>(deck.micro_batch()) * T;
  const double p = layout.tp, q = layout.side();
  const double w = deck.train.precision == Precision::bf16 ? 2 : 4;
  Volumes v;
  auto add = [&](const char* group, Kind kind, double calls, double bytes) {
    v[{group, kind}] = Volume{static_cast<std::uint64_t>(calls), bytes};
  };
  // The loss, the squared gradient norm and three stop votes, once per step over the
  // world (= tp here).
  if (p > 1)
    add("world", Kind::all_reduce, 1, 2.0 * (p - 1) / p * 40);
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    if (layout.sequence_parallel) {
      // Each all-reduce of N H becomes an all-gather and a reduce-scatter of N H / p per
      // rank; the LayerNorm and row-parallel bias gradients (6 per layer, 2 for ln_f)
      // and the loss's row statistics are all-reduced.
      const double rows = (2 + 4 * L) * m, block = w * N * H / p;
      add("tp", Kind::all_gather, rows, rows * (p - 1) * block);
      add("tp", Kind::reduce_scatter, rows, rows * (p - 1) * block);
      add("tp", Kind::all_reduce, (4 + 6 * L) * m,
          2.0 * (p - 1) / p * (4.0 * m * (3 * N + 6 * L * H + 2 * H)));
      break;
    }
    // At p = 1 the loss is one kernel per row: no row statistics are summed.
    add("tp", Kind::all_reduce, (p > 1 ? 4 + 4 * L : 2 + 4 * L) * m,
        2.0 * (p - 1) / p * (m * (w * (2 + 4 * L) * N * H + 4.0 * 3 * N)));
    break;
  case TensorMode::d2: {
    const double c = (q - 1) / q, R = N / q;
    add("tp.row", Kind::broadcast, m * (8 * L * q + q), m * w * c * (14 * L * H * R + R * V));
    add("tp.row", Kind::reduce, m * (4 * L * q + q), m * w * c * (7 * L * H * R + R * V));
    add("tp.row", Kind::all_reduce, m * (3 * (2 * L + 1) + 2),
        m * 4 * 2 * c * ((2 * L + 1) * 4 * R + 3 * R));
    add("tp.col", Kind::broadcast, m * (12 * L * q + 2 * q),
        m * w * c * (24 * L * H * H / q + 2 * V * H / q));
    add("tp.col", Kind::reduce, m * (6 * L * q + q), m * 4 * c * (12 * L * H * H / q + V * H / q));
    // The vectors gathered forward (w bytes), their gradients reduce-scattered (4); the
    // lookup's rows reduce-scattered forward and their gradient gathered backward (w).
    const double vectors = m * (q - 1) * (9 * L * H / (q * q) + 2 * (2 * L + 1) * H / (q * q)),
                 rows = m * (q - 1) * R * H / q;
    add("tp.col", Kind::all_gather, m * (6 * L + 2 * (2 * L + 1) + 1), w * (vectors + rows));
    add("tp.col", Kind::reduce_scatter, m * (6 * L + 2 * (2 * L + 1) + 1), 4 * vectors + w * rows);
    add("tp.col", Kind::all_reduce, m, m * 2 * c * 8);
    break;
  }
  case TensorMode::d3: {
    const double k = q - 1, R = N / (q * q), plane = 2 * (q * q - 1) / (q * q);
    add("tp.a", Kind::all_gather, m * (6 * L + 2), m * w * k * R * H / q * (6 * L + 2));
    add("tp.a", Kind::reduce_scatter, m * (4 * L + 2), m * w * k * R * H / q * (4 * L + 2));
    add("tp.a", Kind::all_reduce, m * 2, m * 4 * 2 * k / q * 3 * R);
    add("tp.b", Kind::all_gather, m * (12 * L + 1),
        m * w * k * (24 * L * H * H + V * H) / (q * q * q));
    add("tp.b", Kind::reduce_scatter, m * (6 * L + 1),
        m * 4 * k * (12 * L * H * H + V * H) / (q * q * q));
    add("tp.b", Kind::all_reduce, m, m * 4 * 2 * k / q * T * H / q);
    add("tp.c", Kind::all_gather, m * (8 * L + 1), m * w * k * (17 * L * R * H / q + R * V / q));
    add("tp.c", Kind::reduce_scatter, m * (6 * L + 1),
        m * w * k * (12 * L * R * H / q + R * V / q));
    add("tp.c", Kind::all_reduce, m * 3 * (2 * L + 1), m * 4 * 2 * k / q * 4 * R * (2 * L + 1));
    add("tp.bc", Kind::all_reduce, m * (4 * L + 1), m * (4 * plane * 7 * L * H / q + plane * 8));
    add("tp.ab", Kind::all_reduce, m * (2 * L + 2 * (2 * L + 1)),
        m * 4 * plane * (2 * L * H / q + 2 * (2 * L + 1) * H / q));
    break;
  }
  }
  return v;
}

} // namespace

// The per-step counters in the metrics equal the closed forms of docs/communication.md, in
// fp32 and under bf16 (2-byte activations and weights, 4-byte gradients and statistics).
TEST(TensorParallel, BytesSentPerStepFollowTheClosedForm) {
  for (const auto& layout : layouts())
    for (const auto& [microbatches, precision] :
         {std::pair{1, Precision::fp32}, {2, Precision::fp32}, {2, Precision::bf16}}) {
      SCOPED_TRACE(layout.describe() + ", " + std::to_string(microbatches) + " micro-batches, " +
                   precision_name(precision));
      const Deck deck = train_deck(layout, microbatches, precision);
      train::Trainer t(deck);
      const auto m = t.step();
      const Volumes expected = closed_form(deck);
      double total = 0;
      for (const auto& [key, e] : expected) {
        SCOPED_TRACE(key.first + " " + comm::kind_name(key.second));
        const auto& want = key; // a structured binding is not captured before C++20
        const auto it = std::find_if(m.traffic.begin(), m.traffic.end(), [&](const auto& x) {
          return x.group == want.first && x.kind == want.second;
        });
        ASSERT_NE(it, m.traffic.end());
        EXPECT_EQ(it->calls, e.calls);
        EXPECT_NEAR(it->bytes, e.bytes, 1e-9 * e.bytes + 1e-9);
        total += e.bytes;
      }
      for (const auto& x : m.traffic) // nothing else was sent
        if (expected.count({x.group, x.kind}) == 0)
          EXPECT_EQ(x.calls, 0u) << x.group << " " << comm::kind_name(x.kind);
      EXPECT_NEAR(m.comm_bytes, total, 1e-9 * total + 1e-9);
      // The library's closed form (cost/traffic.hpp, what cubelm check prints) agrees.
      const auto library = cost::traffic_per_step(deck);
      ASSERT_EQ(library.size(), expected.size());
      for (const auto& e : library) {
        const auto it = expected.find({e.group, e.kind});
        ASSERT_NE(it, expected.end()) << e.group << " " << comm::kind_name(e.kind);
        EXPECT_EQ(e.calls, it->second.calls) << e.group << " " << comm::kind_name(e.kind);
        EXPECT_NEAR(e.bytes, it->second.bytes, 1e-9 * e.bytes + 1e-9)
            << e.group << " " << comm::kind_name(e.kind);
      }
    }
}

// The estimate `cubelm check` prints equals what a rank allocates, in every mode, in fp32
// and under bf16.
TEST(TensorParallel, MemoryPerRankMatchesTheEstimate) {
  for (const auto& layout : layouts())
    for (const auto& [microbatches, precision] :
         {std::pair{1, Precision::fp32}, {2, Precision::fp32}, {2, Precision::bf16}}) {
      SCOPED_TRACE(layout.describe() + ", " + precision_name(precision));
      const Deck deck = train_deck(layout, microbatches, precision);
      train::Trainer t(deck);
      const cost::Memory measured = t.memory();
      const cost::Memory estimate = cost::estimate_memory(deck);
      EXPECT_EQ(measured.parameters, estimate.parameters);
      EXPECT_EQ(measured.gradients, estimate.gradients);
      EXPECT_EQ(measured.optimizer, estimate.optimizer);
      EXPECT_EQ(measured.activations, estimate.activations);
    }
}

// Every model checks, as it is built, that its mode allocated the buffers tp/buffers.hpp
// describes (the memory estimate's); here on the whole model, on a middle pipeline stage
// (no embedding) and, on one rank, the 2d and 3d modes of one rank. A description of
// another stage (one layer more) differs, and the check names the buffer.
TEST(TensorParallel, ModesAllocateTheBuffersTheirDescriptionNames) {
  std::vector<comm::Layout> all = layouts();
  if (comm::Communicator::world().size() == 1) {
    all.push_back(comm::Layout{1, 1, 1, TensorMode::d2});
    all.push_back(comm::Layout{1, 1, 1, TensorMode::d3});
  }
  const ModelConfig c = tiny();
  const int batch = 4;
  for (const auto& layout : all)
    for (const bool middle : {false, true}) {
      SCOPED_TRACE(layout.describe() + (middle ? ", middle stage" : ", whole model"));
      cost::StageLayout stage = cost::StageLayout::whole(c.layers);
      if (middle) {
        stage.chunks = {{1}};
        stage.first = stage.last = false;
      }
      std::unique_ptr<model::GridModel<float>> m;
      ASSERT_NO_THROW(m = std::make_unique<model::GridModel<float>>(
                          c, batch, 5, layout, comm::Communicator::world(), stage));
      const tp::StageParts other{
          batch,        c.seq_len, c.seq_len, c.hidden, tp::padded_vocab(c, layout),
          c.layers + 1, 0,         !middle,   !middle};
      try {
        m->mode->check_buffers(other);
        ADD_FAILURE() << "a description of one layer more passed the check";
      } catch (const InternalError& e) {
        EXPECT_NE(std::string(e.what()).find("ln/sums: allocated"), std::string::npos) << e.what();
      }
    }
  // A buffer on one side only is a difference too.
  tp::BufferSizes a, d;
  a.emplace("moe/keys", tp::Buffer{"moe/keys", 8, tp::Holds::ids});
  EXPECT_EQ(tp::compare_buffers(a, d), "moe/keys: allocated 8 elements, described 0");
  d.emplace("moe/keys", tp::Buffer{"moe/keys", 8, tp::Holds::ids});
  EXPECT_EQ(tp::compare_buffers(a, d), "");
  d.emplace("ln/sums", tp::Buffer{"ln/sums", 4});
  EXPECT_EQ(tp::compare_buffers(a, d), "ln/sums: allocated 0 elements, described 4");
}

// bf16 storage (train.precision = "bf16"): activations, their gradients and the weights
// the kernels read in bfloat16, statistics, gradients and master weights in float. Every
// layout computes what the single-process bf16 model computes up to where partial sums
// are rounded (a row-parallel output is summed from bf16 partials, the single process
// rounds the whole sum once).
TEST(TensorParallel, Bf16ModelMatchesTheSingleProcessBf16Model) {
  for (const auto& layout : layouts())
    check_equivalence<bf16>(layout, 2e-3, 2e-2);
}

// The bf16 model near the fp32 model on one process, and its buffers: what each layout
// allocates is what the description (the memory estimate's, 2-byte values and 4-byte
// statistics and gradients) says, and the activations take less than 0.65 of the fp32
// model's bytes even in this tiny model, whose float attention blocks and statistics
// weigh more than in a real one.
TEST(TensorParallel, Bf16ModelIsNearTheFp32ModelInLessMemory) {
  const ModelConfig c = tiny();
  const int batch = 4, n = batch * c.seq_len;
  const auto in = random_tokens(n, c.vocab_size, 1), tgt = random_tokens(n, c.vocab_size, 2);
  auto f = model::GridModel<float>::single(c, batch, 9);
  auto b = model::GridModel<bf16>::single(c, batch, 9);
  const double lf = f.model->forward_backward(ExecSpace(), in, tgt, 1.0 / n);
  const double lb = b.model->forward_backward(ExecSpace(), in, tgt, 1.0 / n);
  EXPECT_NEAR(lb, lf, 5e-3 * lf);
  double gmax = 0, worst = 0;
  for (const auto& p : f.model->params())
    for (const double g : host(p.grad))
      gmax = std::max(gmax, std::fabs(g));
  for (const auto& p : f.model->params()) {
    const auto gf = host(p.grad), gb = host(b.model->param(p.name).grad);
    for (std::size_t i = 0; i < gf.size(); ++i)
      worst = std::max(worst, std::fabs(gb[i] - gf[i]));
  }
  EXPECT_LT(worst, 5e-2 * gmax);
  EXPECT_GT(worst, 0.0); // the bf16 model does round
  const double ratio = static_cast<double>(b.model->memory().activations) /
                       static_cast<double>(f.model->memory().activations);
  EXPECT_LT(ratio, 0.65);
  EXPECT_GT(ratio, 0.5);
  for (const auto& layout : layouts()) {
    SCOPED_TRACE(layout.describe());
    std::unique_ptr<model::GridModel<bf16>> m;
    ASSERT_NO_THROW(m = std::make_unique<model::GridModel<bf16>>(c, batch, 9, layout,
                                                                 comm::Communicator::world()));
    const cost::StageLayout stage = cost::StageLayout::whole(c.layers);
    EXPECT_EQ(m->model->memory().activations,
              cost::activation_bytes(c, layout, batch, cost::stage_shape(c, stage, layout), 2));
  }
}

// Per-rank parameters: under 1D only LayerNorms, wpe and a few biases are replicated;
// under 2D everything but wpe is split q^2 ways; under 3D the weights (wte and the
// blocks' matrices) fall as 1/q^3 and the vectors and wpe as 1/q.
TEST(TensorParallel, ParameterMemoryFallsWithTheMode) {
  for (const auto& layout : layouts()) {
    SCOPED_TRACE(layout.describe());
    const Deck deck = train_deck(layout);
    train::Trainer t(deck);
    const ModelConfig& c = deck.model;
    const std::int64_t H = c.hidden, V = tp::padded_vocab(c, layout), T = c.seq_len, L = c.layers;
    const std::int64_t weights = V * H + 12 * L * H * H, vectors = (13 * L + 2) * H;
    std::int64_t w = 0, vec = 0, pos = 0;
    for (const auto& p : t.model().params())
      (p.name == "wpe" ? pos : p.shape.size() == 2 ? w : vec) += p.size();
    const std::int64_t q = layout.side(), p = layout.tp;
    switch (layout.mode) {
    case TensorMode::d3:
      EXPECT_EQ(w * q * q * q, weights);
      EXPECT_EQ(vec * q, vectors);
      EXPECT_EQ(pos * q, T * H);
      break;
    case TensorMode::d2:
      EXPECT_EQ(w * q * q, weights);
      EXPECT_EQ(vec * q * q, vectors);
      EXPECT_EQ(pos * q, T * H);
      break;
    default:
      EXPECT_EQ(w * p, weights);
      EXPECT_EQ(vec, 7 * L * H / p + 6 * L * H + 2 * H);
      EXPECT_EQ(pos, T * H);
    }
    EXPECT_EQ(4 * (w + vec + pos), t.memory().parameters);
  }
}
