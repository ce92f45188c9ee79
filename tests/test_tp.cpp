// Tensor-parallel equivalence: the model written against tp::Mode, on every
// rank of a 1D group, gives the single-process model's loss, and each rank's
// block of every parameter and gradient equals the same block of the
// single-process model's (the same code on MPI_COMM_SELF, itself checked against
// finite differences in test_model; double precision, and float within 1e-5).

#include "cubelm/model/shape.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/train/trainer.hpp"

#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <unistd.h>

using namespace cubelm;

namespace {

io::ModelConfig tiny() {
  return cubelm::testing::tiny_model(32, 16, 8);
}

using cubelm::testing::random_tokens;

template <class T>
std::vector<double> host(const kernels::Vec<T>& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

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

// The layouts of the whole world that the tests run: 1D at every size, 2D on a
// square, 3D on a cube.
std::vector<comm::Layout> layouts() {
  const int p = comm::Communicator::world().size();
  std::vector<comm::Layout> out;
  out.push_back(comm::Layout{1, 1, p, p == 1 ? comm::TensorMode::none : comm::TensorMode::d1});
  if (p == 4)
    out.push_back(comm::Layout{1, 1, p, comm::TensorMode::d2});
  if (p == 8)
    out.push_back(comm::Layout{1, 1, p, comm::TensorMode::d3});
  return out;
}

template <class T>
void check_equivalence(const comm::Layout& layout, double loss_tol, double grad_tol) {
  SCOPED_TRACE(comm::mode_name(layout.mode));
  const comm::ProcessGrid grid(layout, comm::Communicator::world());
  const io::ModelConfig c = tiny();
  const int batch = 4, n = batch * c.seq_len;
  const std::uint64_t seed = 77;
  auto single = model::GridModel<T>::single(c, batch, seed);
  auto& reference = *single.model;
  auto mode = tp::make_mode<T>(grid);
  model::ShardedGPT<T> sharded(c, batch, seed, *mode);
  ASSERT_STREQ(mode->name(), comm::mode_name(layout.mode));

  const auto in = random_tokens(n, c.vocab_size, 1), tgt = random_tokens(n, c.vocab_size, 2);
  for (int pass = 0; pass < 2; ++pass) { // the second pass accumulates onto the first
    const double ref_loss = reference.forward_backward(in, tgt, 1.0 / n);
    const double loss = sharded.forward_backward(in, tgt, 1.0 / n);
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

io::Deck train_deck(int tp) {
  const std::string mode = tp == 1 ? "none" : "1d";
  const std::string text = R"([model]
vocab_size = 32
seq_len = 8
hidden = 16
heads = 8
layers = 2
[parallel]
tensor_mode = ")" + mode + R"("
tensor_size = )" + std::to_string(tp) +
                           R"(
[train]
steps = 10
global_batch = 4
seed = 3
[optimizer]
lr = 1e-2
warmup_steps = 2
[data]
synthetic_tokens = 5000
[log]
peak_gflops = 1.0
)";
  return io::parse_deck(text, "tp.toml");
}

comm::Communicator self() {
  return comm::Communicator::duplicate(MPI_COMM_SELF);
}

} // namespace

TEST(TensorParallel1D, TenAdamWStepsMatchTheSingleProcessRun) {
  const int n = comm::Communicator::world().size();
  train::Trainer group(train_deck(n)), single(train_deck(1), self());
  for (int s = 0; s < 10; ++s) {
    const auto a = group.step(), b = single.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << "step " << s;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << "step " << s;
    if (n > 1)
      EXPECT_GT(a.comm_bytes, 0.0);
    else
      EXPECT_EQ(a.comm_bytes, 0.0);
  }
}

TEST(TensorParallel1D, CheckpointOfTheGroupResumesOnOneProcess) {
  const comm::Communicator world = comm::Communicator::world();
  long long id = static_cast<long long>(::getpid());
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, world.raw());
  const std::string path =
      (std::filesystem::temp_directory_path() / ("cubelm_test_tp_" + std::to_string(id) + ".h5"))
          .string();
  train::Trainer group(train_deck(world.size()));
  for (int s = 0; s < 3; ++s)
    group.step();
  group.save(path); // every rank writes its blocks; replicas write nothing
  train::Trainer single(train_deck(1), self());
  single.resume(path); // every rank reads the whole model alone
  EXPECT_EQ(single.steps_done(), 3);
  for (int s = 3; s < 6; ++s) {
    const auto a = group.step(), b = single.step();
    EXPECT_NEAR(b.loss, a.loss, 1e-4 * a.loss) << "step " << s;
  }
  MPI_Barrier(world.raw());
  if (world.rank() == 0)
    std::filesystem::remove(path);
}

// docs/communication.md, "1D per step": with N tokens per micro-batch, m micro-batches,
// every rank sends 2 (p-1)/p x [4 m ((2 + 4 L) N H + 3 N) + 8] bytes in (4 + 4L) m + 1
// all-reduces over "tp", and nothing over any other group.
TEST(TensorParallel1D, BytesSentPerStepFollowTheClosedForm) {
  const int p = comm::Communicator::world().size();
  for (int microbatches : {1, 2}) {
    io::Deck deck = train_deck(p);
    deck.parallel.microbatches = microbatches;
    train::Trainer t(deck);
    const auto m = t.step();
    const double N = static_cast<double>(deck.micro_batch()) * deck.model.seq_len;
    const double H = deck.model.hidden, L = deck.model.layers;
    const double expected =
        2.0 * (p - 1) / p * (4.0 * microbatches * ((2 + 4 * L) * N * H + 3 * N) + 8.0);
    const std::uint64_t calls = static_cast<std::uint64_t>((4 + 4 * L) * microbatches + 1);
    bool found = false;
    for (const auto& e : m.traffic) {
      if (e.group == "tp" && e.kind == comm::Kind::all_reduce) {
        found = true;
        EXPECT_EQ(e.calls, calls);
        EXPECT_NEAR(e.bytes, expected, 1e-9 * expected + 1e-9);
      } else {
        EXPECT_EQ(e.bytes, 0.0) << e.group << " " << comm::kind_name(e.kind);
      }
    }
    EXPECT_TRUE(found);
    EXPECT_NEAR(m.comm_bytes, expected, 1e-9 * expected + 1e-9);
  }
}

// The estimate `cubelm check` prints equals what a rank allocates.
TEST(TensorParallel1D, MemoryPerRankMatchesTheEstimate) {
  const int p = comm::Communicator::world().size();
  const io::Deck deck = train_deck(p);
  train::Trainer t(deck);
  const model::Memory measured = t.memory();
  const auto estimate = model::estimate_memory(deck);
  ASSERT_TRUE(estimate.has_value());
  EXPECT_EQ(measured.parameters, estimate->parameters);
  EXPECT_EQ(measured.gradients, estimate->gradients);
  EXPECT_EQ(measured.optimizer, estimate->optimizer);
  EXPECT_EQ(measured.activations, estimate->activations);
  // Parameters per rank shrink with p: only LayerNorms, wpe and a few biases are replicated.
  const auto single = model::estimate_memory(train_deck(1));
  const double H = deck.model.hidden, T = deck.model.seq_len, L = deck.model.layers;
  const double replicated = 4.0 * (T * H + L * 6 * H + 2 * H);
  EXPECT_NEAR(static_cast<double>(estimate->parameters),
              (single->parameters - replicated) / p + replicated, 4.0 * 7 * L * H);
}
