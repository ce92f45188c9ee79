// The whole GPT in double precision: every parameter gradient against central
// finite differences of the mean loss; initialisation rules of docs/model.md.

#include "cubelm/cost/activations.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/kernels/attention.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/tp/attention.hpp"
#include "cubelm/tp/shapes.hpp"

#include "test_helpers.hpp"
#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

using namespace cubelm;
using namespace cubelm::model;
using namespace cubelm::cost;
using cubelm::tp::init_normal;
using cubelm::tp::Param;

namespace {

ModelConfig tiny() {
  return cubelm::testing::tiny_model(11, 8, 2);
}

using cubelm::testing::random_tokens;

} // namespace

TEST(Model, ParameterNamesShapesAndCount) {
  auto net = GridModel<float>::single(tiny(), 2, 1);
  auto& gpt = *net.model;
  std::int64_t total = 0;
  for (const auto& p : gpt.params())
    total += p.size();
  // The vocabulary of 11 is padded to 128 rows (model.vocab_divisible_by), which count in
  // memory but not among the model's parameters.
  EXPECT_EQ(total, parameter_count(tiny()) + (128 - 11) * 8);
  EXPECT_EQ(gpt.param("wte").shape, (std::vector<std::int64_t>{128, 8}));
  EXPECT_EQ(gpt.param("wte").padding_rows, 128 - 11);
  EXPECT_EQ(gpt.param("layers/1/mlp/w1").shape, (std::vector<std::int64_t>{8, 32}));
  EXPECT_EQ(gpt.param("layers/0/attn/bo").shape, (std::vector<std::int64_t>{8}));
  EXPECT_TRUE(gpt.param("wpe").decay);
  EXPECT_FALSE(gpt.param("ln_f/gamma").decay);
}

TEST(Model, InitialisationFollowsTheRules) {
  ModelConfig c = tiny();
  c.hidden = 64;
  c.layers = 4;
  auto na = GridModel<double>::single(c, 1, 42), nb = GridModel<double>::single(c, 1, 42),
       nother = GridModel<double>::single(c, 1, 43);
  auto &a = *na.model, &b = *nb.model, &other = *nother.model;
  auto stats = [](const Param<double>& p) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.value);
    double s = 0, s2 = 0;
    for (std::int64_t i = 0; i < p.size(); ++i) {
      s += h(i);
      s2 += h(i) * h(i);
    }
    return std::make_pair(s / p.size(), std::sqrt(s2 / p.size()));
  };
  const auto [m1, sd1] = stats(a.param("layers/0/mlp/w1"));
  EXPECT_NEAR(m1, 0.0, 0.002);
  EXPECT_NEAR(sd1, 0.02, 0.001);
  const auto [m2, sd2] = stats(a.param("layers/2/mlp/w2"));
  EXPECT_NEAR(sd2, 0.02 / std::sqrt(8.0), 0.0007);
  EXPECT_EQ(stats(a.param("layers/1/attn/bq")).second, 0.0);
  EXPECT_EQ(stats(a.param("ln_f/gamma")).first, 1.0);
  // Deterministic in the seed, and a value depends only on (seed, name, index).
  auto first = [](const Param<double>& p) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.value);
    return h(5);
  };
  EXPECT_EQ(first(a.param("wte")), first(b.param("wte")));
  EXPECT_NE(first(a.param("wte")), first(other.param("wte")));
  EXPECT_DOUBLE_EQ(first(a.param("wte")), 0.02 * init_normal(42, "wte", 5));
}

TEST(Model, EveryGradientMatchesFiniteDifferences) {
  const ModelConfig c = tiny();
  const int batch = 2;
  auto net = GridModel<double>::single(c, batch, 7);
  auto& gpt = *net.model;
  // Larger random weights than the initialisation, so that every path carries signal.
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> dist(-0.5, 0.5);
  for (auto& p : gpt.params()) {
    auto h = Kokkos::create_mirror_view(p.value);
    for (std::int64_t i = 0; i < p.size(); ++i)
      h(i) = (p.name.find("gamma") != std::string::npos ? 1.0 : 0.0) + dist(gen);
    Kokkos::deep_copy(p.value, h);
  }
  const int n = batch * c.seq_len;
  const auto in = random_tokens(n, c.vocab_size, 1), tgt = random_tokens(n, c.vocab_size, 2);
  const double scale = 1.0 / n;
  gpt.zero_grad();
  gpt.forward_backward(ExecSpace(), in, tgt, scale);
  double worst = 0;
  std::string worst_name;
  for (auto& p : gpt.params()) {
    const cubelm::testing::FdError e = cubelm::testing::fd_error(
        p.value, p.grad, [&] { return gpt.forward_backward(ExecSpace(), in, tgt, 0.0) * scale; },
        1e-3, true);
    if (e.worst > worst) {
      worst = e.worst;
      worst_name = p.name + "[" + std::to_string(e.at) + "]";
    }
  }
  EXPECT_LT(worst, 1e-6) << "worst at " << worst_name;
}

TEST(Model, LossOfTheUntrainedModelIsNearLogVocab) {
  ModelConfig c = tiny();
  c.vocab_size = 64;
  auto net = GridModel<float>::single(c, 4, 11);
  auto& gpt = *net.model;
  const int n = 4 * c.seq_len;
  const double loss =
      gpt.forward_backward(ExecSpace(), random_tokens(n, 64, 5), random_tokens(n, 64, 6), 0.0) / n;
  EXPECT_NEAR(loss, std::log(64.0), 0.05);
}

namespace {

// The model on this process alone, with `stage` (chunks, slots, recomputation).
struct Alone {
  Alone(const ModelConfig& c, int batch, StageLayout stage)
      : grid(comm::Layout{}, comm::Communicator::duplicate(MPI_COMM_SELF)),
        mode(tp::make_mode<double>(grid)), model(c, batch, 7, *mode, std::move(stage)) {}
  comm::ProcessGrid grid;
  std::unique_ptr<tp::Mode<double>> mode;
  ShardedGPT<double> model;
};

std::vector<double> gradients(const ShardedGPT<double>& gpt) {
  std::vector<double> all;
  for (const auto& p : gpt.params()) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.grad);
    all.insert(all.end(), h.data(), h.data() + h.extent(0));
  }
  return all;
}

void expect_same(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  double top = 0;
  for (const double x : b)
    top = std::max(top, std::fabs(x));
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-12 * top) << "element " << i;
}

} // namespace

// Two micro-batches accumulated give the gradient of the whole batch.
TEST(Model, MicroBatchAccumulationEqualsTheFullBatchGradient) {
  const ModelConfig c = tiny();
  const int n = 4 * c.seq_len, half = n / 2;
  const auto in = random_tokens(n, c.vocab_size, 5), tgt = random_tokens(n, c.vocab_size, 6);
  Alone full(c, 4, {}), micro(c, 2, {});
  full.model.zero_grad();
  micro.model.zero_grad();
  const double whole = full.model.forward_backward(ExecSpace(), in, tgt, 1.0 / n);
  double parts = 0;
  for (int k = 0; k < 2; ++k)
    parts += micro.model.forward_backward(
        ExecSpace(), std::vector<std::int32_t>(in.begin() + k * half, in.begin() + (k + 1) * half),
        std::vector<std::int32_t>(tgt.begin() + k * half, tgt.begin() + (k + 1) * half), 1.0 / n);
  EXPECT_NEAR(parts, whole, 1e-12 * whole);
  expect_same(gradients(micro.model), gradients(full.model));
}

// Chunks and recomputation change neither the loss nor a gradient; recomputation
// keeps less: each layer's input instead of its activations.
TEST(Model, ChunksAndRecomputationKeepTheGradients) {
  ModelConfig c = tiny();
  c.layers = 3;
  const int n = 2 * c.seq_len;
  const auto in = random_tokens(n, c.vocab_size, 8), tgt = random_tokens(n, c.vocab_size, 9);
  StageLayout chunks;
  chunks.chunks = {{0}, {1, 2}};
  chunks.slots = 2;
  StageLayout redo = StageLayout::whole(c.layers);
  redo.recompute = true;
  StageLayout both = chunks;
  both.recompute = true;
  Alone ref(c, 2, {});
  ref.model.zero_grad();
  const double loss = ref.model.forward_backward(ExecSpace(), in, tgt, 1.0 / n);
  const auto expected = gradients(ref.model);
  for (const StageLayout& s : {chunks, redo, both}) {
    SCOPED_TRACE(std::string(s.recompute ? "recompute, " : "") + std::to_string(s.chunks.size()) +
                 " chunk(s)");
    Alone other(c, 2, s);
    other.model.zero_grad();
    EXPECT_NEAR(other.model.forward_backward(ExecSpace(), in, tgt, 1.0 / n), loss, 1e-12 * loss);
    expect_same(gradients(other.model), expected);
  }
  EXPECT_LT(Alone(c, 2, redo).model.memory().activations, ref.model.memory().activations);
}

// Every stage checks, as it is built, that it allocated the activation buffers that
// cost/activations.hpp describes; here stages of each kind: chunks and slots, recomputation,
// no embedding or no head, an MoE layer and a dense one at the same position of two chunks.
// Their memory is the estimate's. The description of another stage differs, and names the
// buffer.
TEST(Model, StagesAllocateTheActivationBuffersTheirDescriptionNames) {
  ModelConfig c = tiny();
  c.layers = 4;
  c.experts = 4;
  c.top_k = 2;
  c.moe_every = 2; // layers 1 and 3
  const int batch = 2;
  StageLayout whole = StageLayout::whole(c.layers);
  StageLayout chunks; // position 0: layers 0 (dense) and 3 (MoE); position 1: layer 1 (MoE)
  chunks.chunks = {{0, 1}, {3}};
  chunks.slots = 3;
  chunks.last = false;
  StageLayout redo = chunks;
  redo.recompute = true;
  redo.first = false;
  redo.last = true;
  StageLayout middle;
  middle.chunks = {{1, 2}};
  middle.first = middle.last = false;
  middle.slots = 2;
  const comm::Layout one;
  for (const StageLayout& s : {whole, chunks, redo, middle}) {
    SCOPED_TRACE(std::to_string(s.chunks.size()) + " chunk(s), " + std::to_string(s.slots) +
                 " slot(s)" + (s.recompute ? ", recompute" : "") + (s.first ? ", first" : "") +
                 (s.last ? ", last" : ""));
    std::unique_ptr<Alone> a;
    ASSERT_NO_THROW(a = std::make_unique<Alone>(c, batch, s));
    StageShape shape = stage_shape(c, s, one);
    EXPECT_EQ(
        tp::compare_buffers(a->model.activation_buffers(), stage_activations(c, one, batch, shape)),
        "");
    EXPECT_EQ(a->model.memory().activations, activation_bytes(c, one, batch, shape, 8));
    shape.last = !shape.last;
    const std::string differs =
        tp::compare_buffers(a->model.activation_buffers(), stage_activations(c, one, batch, shape));
    EXPECT_EQ(differs.rfind("ln_f: allocated ", 0), 0u) << differs;
  }
}

namespace {

// The model's attention (tp::BlockAttention on one rank: blocks of the sequence, the
// log-sum-exp saved) against the kernels that keep every probability (attention_forward
// and attention_backward), output and gradients.
template <class T>
void expect_block_attention_equals_stored(int seq, double tolerance) {
  SCOPED_TRACE("T = " + std::to_string(seq) + ", " +
               std::to_string(tp::attention_blocks(1, seq).per_rank) + " block(s)");
  const ExecSpace exec;
  const int batch = 2, heads = 3, d = 4, hid = heads * d;
  const std::int64_t rows = static_cast<std::int64_t>(batch) * seq;
  Mat<T> q("q", rows, hid), k("k", rows, hid), v("v", rows, hid), dout("dout", rows, hid);
  cubelm::testing::randomize(q, 41, -3.0, 3.0);
  cubelm::testing::randomize(k, 42);
  cubelm::testing::randomize(v, 43);
  cubelm::testing::randomize(dout, 44);
  Mat<T> out("out", rows, hid), dq("dq", rows, hid), dk("dk", rows, hid), dv("dv", rows, hid);
  kernels::Tensor4<T> probs("probs", batch, heads, seq, seq),
      scratch("scratch", batch, heads, seq, seq);
  const kernels::AttentionWorkspace<T> work(batch, heads, seq, d);
  kernels::attention_forward<T>(exec, q, k, v, heads, probs, work, out);
  kernels::attention_backward<T>(exec, q, k, v, heads, probs, dout, scratch, work, dq, dk, dv);

  const tp::BlockAttention<T> blocks(nullptr, batch, heads, seq, d);
  const kernels::Batch<T> saved = blocks.make_saved();
  Mat<T> bout("bout", rows, hid), bdq("bdq", rows, hid), bdk("bdk", rows, hid),
      bdv("bdv", rows, hid);
  blocks.forward(exec, q, k, v, saved, bout);
  blocks.backward(exec, q, k, v, bout, saved, dout, bdq, bdk, bdv);
  exec.fence();
  using cubelm::testing::host;
  using cubelm::testing::max_error;
  EXPECT_LT(max_error(host(bout), host(out)), tolerance);
  EXPECT_LT(max_error(host(bdq), host(dq)), tolerance);
  EXPECT_LT(max_error(host(bdk), host(dk)), tolerance);
  EXPECT_LT(max_error(host(bdv), host(dv)), tolerance);
}

} // namespace

// Attention keeps no T x T matrix between passes, and gives what the kernels that keep
// them give: within 1e-5 in fp32 and 1e-12 in double, for one block (an odd length, a
// short one) and for 2 and 4 blocks of 128 tokens.
TEST(Model, BlockAttentionEqualsTheAttentionThatStoresItsProbabilities) {
  EXPECT_EQ(tp::attention_blocks(1, 7).per_rank, 1);
  EXPECT_EQ(tp::attention_blocks(1, 255).per_rank, 1);
  EXPECT_EQ(tp::attention_blocks(1, 256).per_rank, 2);
  EXPECT_EQ(tp::attention_blocks(1, 1024).length, 128);
  EXPECT_EQ(tp::attention_blocks(4, 64).per_rank, 2);
  for (const int seq : {7, 64, 256, 512}) {
    expect_block_attention_equals_stored<float>(seq, 1e-5);
    expect_block_attention_equals_stored<double>(seq, 1e-12);
  }
}
