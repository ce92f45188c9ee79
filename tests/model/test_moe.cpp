// Mixture-of-Experts feed-forward on one process (docs/model.md): the routing in closed
// form, one MoE layer against an independent host computation (dropless and with
// dropped tokens), every gradient of an MoE model against central finite differences in
// double precision (routing held fixed), dropless equal to a capacity that drops nothing,
// experts = 1 equal to the dense model, a short training run that learns and resumes
// bitwise, the deck's rules, and the memory estimate against the allocation.

#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/kernels/moe.hpp"
#include "cubelm/model/sharded_gpt.hpp"
#include "cubelm/tp/mode.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "test_helpers.hpp"
#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;
using cubelm::testing::host;
using cubelm::testing::random_tokens;

namespace {

using HostMat = std::vector<std::vector<double>>;

ModelConfig moe_model(int experts, int top_k, double capacity = 0, double aux = 0.1) {
  ModelConfig c = cubelm::testing::tiny_model(11, 8, 2);
  c.experts = experts;
  c.top_k = top_k;
  c.capacity_factor = capacity;
  c.aux_loss = aux;
  return c;
}

void fill(tp::Param<double>& p, std::mt19937& gen, double scale, double offset = 0) {
  std::uniform_real_distribution<double> dist(-scale, scale);
  auto h = Kokkos::create_mirror_view(p.value);
  for (std::int64_t i = 0; i < p.size(); ++i)
    h(i) = offset + dist(gen);
  Kokkos::deep_copy(p.value, h);
}

// Larger random weights than the initialisation, so that every path carries signal.
void randomise(model::ShardedGPT<double>& gpt, unsigned seed) {
  std::mt19937 gen(seed);
  for (auto& p : gpt.params())
    fill(p, gen, 0.5, p.name.find("gamma") != std::string::npos ? 1.0 : 0.0);
}

// The objective the model trains on for one micro-batch: (loss sum + N aux) / N.
double objective(model::ShardedGPT<double>& gpt, const std::vector<std::int32_t>& in,
                 const std::vector<std::int32_t>& tgt) {
  const double n = static_cast<double>(in.size());
  const double ce = gpt.forward_backward(ExecSpace(), in, tgt, 0.0);
  return (ce + gpt.take_aux_sum()) / n;
}

// The worst relative error of the gradient against central differences, over every
// parameter; `name` gets the worst element's name.
double worst_gradient_error(model::ShardedGPT<double>& gpt, const std::vector<std::int32_t>& in,
                            const std::vector<std::int32_t>& tgt, std::string& name) {
  const double scale = 1.0 / static_cast<double>(in.size());
  gpt.zero_grad();
  gpt.forward_backward(ExecSpace(), in, tgt, scale);
  gpt.take_aux_sum();
  double worst = 0;
  for (auto& p : gpt.params()) {
    // Every element on CPUs; about 8 of each tensor on a GPU (each objective is some
    // hundred kernel launches there), which keeps every kernel's gradient under test.
    const cubelm::testing::FdError e = cubelm::testing::fd_error(
        p.value, p.grad, [&] { return objective(gpt, in, tgt); }, 1e-3, true);
    if (e.worst > worst) {
      worst = e.worst;
      name = p.name + "[" + std::to_string(e.at) + "]";
    }
  }
  return worst;
}

} // namespace

// Softmax, top-k with ties to the lower index, renormalised gates and the Switch loss on
// a hand-made input.
TEST(MoE, RoutingAndAuxLossClosedForm) {
  const ExecSpace exec;
  // Logits of three tokens over four experts; token 1 ties experts 1 and 2.
  const double logits[3][4] = {{0, 1, 2, 3}, {0, 2, 2, -1}, {1, 0, 0, 0}};
  kernels::Mat<double> probs("probs", 3, 4), gate("gate", 3, 2);
  kernels::IntMat choice("choice", 3, 2);
  auto hp = Kokkos::create_mirror_view(probs);
  for (int t = 0; t < 3; ++t)
    for (int e = 0; e < 4; ++e)
      hp(t, e) = logits[t][e];
  Kokkos::deep_copy(probs, hp);
  kernels::moe_route<double>(exec, probs, choice, gate);
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), choice);
  auto hg = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gate);
  Kokkos::deep_copy(hp, probs);
  const int expected[3][2] = {{3, 2}, {1, 2}, {0, 1}};
  double p[3][4];
  for (int t = 0; t < 3; ++t) {
    double z = 0;
    for (int e = 0; e < 4; ++e)
      z += std::exp(logits[t][e]);
    for (int e = 0; e < 4; ++e) {
      p[t][e] = std::exp(logits[t][e]) / z;
      EXPECT_NEAR(hp(t, e), p[t][e], 1e-15);
    }
    for (int j = 0; j < 2; ++j)
      EXPECT_EQ(hc(t, j), expected[t][j]) << "token " << t << " choice " << j;
    const double a = p[t][expected[t][0]], b = p[t][expected[t][1]];
    EXPECT_NEAR(hg(t, 0), a / (a + b), 1e-15);
    EXPECT_NEAR(hg(t, 1), b / (a + b), 1e-15);
  }
  EXPECT_DOUBLE_EQ(hg(1, 0), 0.5); // the tie: equal gates
  EXPECT_NEAR(hg(0, 0), 1.0 / (1.0 + std::exp(-1.0)), 1e-15);

  // Dispatch without capacity: f = (1, 2, 2, 1) / 6; the loss is coef E sum f_e P_e.
  kernels::Tokens keys("keys", 6);
  kernels::TokenIndexer sorter;
  kernels::IntMat slot("slot", 3, 2);
  kernels::IntVec pairs("pairs", 6), offsets("offsets", 5);
  kernels::Vec<double> fraction("fraction", 4);
  kernels::moe_dispatch<double>(exec, choice, -1, keys, sorter, slot, pairs, offsets, fraction);
  const std::vector<double> f = host(fraction);
  const double want_f[4] = {1.0 / 6, 2.0 / 6, 2.0 / 6, 1.0 / 6};
  double aux = 0;
  for (int e = 0; e < 4; ++e) {
    EXPECT_DOUBLE_EQ(f[static_cast<std::size_t>(e)], want_f[e]);
    aux += want_f[e] * (p[0][e] + p[1][e] + p[2][e]) / 3;
  }
  aux *= 0.01 * 4;
  Kokkos::View<double*, MemSpace> means("means", 4), total("total", 1);
  kernels::moe_aux_loss<double>(exec, probs, fraction, 0.01 * 4 * 3, means, total);
  EXPECT_NEAR(host(total)[0] / 3, aux, 1e-16);
  // Rows are grouped by expert, first choices first: expert 2 holds (t0, j1) then (t1, j1).
  EXPECT_EQ(host(offsets), (std::vector<double>{0, 1, 3, 5, 6}));
  const std::vector<double> pr = host(pairs);
  EXPECT_EQ(pr, (std::vector<double>{2, 1, 5, 3, 4, 0})); // pair = j N + t

  // Capacity 1: each expert keeps the first pair in priority order.
  kernels::moe_dispatch<double>(exec, choice, 1, keys, sorter, slot, pairs, offsets, fraction);
  auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), slot);
  // Priority order: (t0,3) (t1,1) (t2,0) then (t0,2) (t1,2) (t2,1): expert 2 keeps t0's,
  // expert 1 keeps t1's first choice, so t1's and t2's second choices drop.
  EXPECT_GE(hs(0, 0), 0);
  EXPECT_GE(hs(1, 0), 0);
  EXPECT_GE(hs(2, 0), 0);
  EXPECT_GE(hs(0, 1), 0);
  EXPECT_EQ(hs(1, 1), -1);
  EXPECT_EQ(hs(2, 1), -1);
  EXPECT_EQ(host(offsets), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(host(fraction), f); // the load counts pairs before dropping
}

// One MoE layer against a host computation written from docs/model.md: dropless, and
// with a capacity that drops pairs.
TEST(MoE, LayerMatchesAnIndependentReference) {
  const int N = 24, H = 8, F = 32, E = 4;
  for (const int k : {1, 2})
    for (const double c : {0.0, 0.5, 1.0}) {
      SCOPED_TRACE("top_k " + std::to_string(k) + " capacity_factor " + std::to_string(c));
      comm::ProcessGrid grid(comm::Layout{}, comm::Communicator::duplicate(MPI_COMM_SELF));
      auto mode = tp::make_mode<double>(grid);
      tp::Params<double> params;
      const cost::LayerParams n = cost::layer_params(0, E);
      const double coef = 0.05;
      auto moe = mode->moe(params, tp::MoeNames{n.router, n.ew1, n.eb1, n.ew2, n.eb2},
                           tp::MoeShape{E, k, c, coef}, H, N, 0.02, 0.01, 3);
      ASSERT_EQ(params.size(), 1u + 4u * E);
      std::mt19937 gen(17);
      for (auto& p : params)
        fill(p, gen, 0.6);
      auto get = [&](const std::string& name) {
        for (auto& p : params)
          if (p.name == name)
            return host(p.value);
        return std::vector<double>();
      };
      kernels::Mat<double> x("x", N, H), y("y", N, H);
      auto hx = Kokkos::create_mirror_view(x);
      std::uniform_real_distribution<double> dist(-1, 1);
      for (int t = 0; t < N; ++t)
        for (int i = 0; i < H; ++i)
          hx(t, i) = dist(gen);
      Kokkos::deep_copy(x, hx);
      kernels::MoeSaved<double> saved = moe->make_saved();
      Kokkos::View<double*, MemSpace> aux("aux", 1);
      moe->forward(ExecSpace(), x, y, saved, aux);
      const std::vector<double> got = host(y);

      // The reference.
      const std::vector<double> wr = get(n.router);
      std::vector<std::vector<double>> prob(N, std::vector<double>(E));
      std::vector<std::vector<int>> chosen(N);
      std::vector<std::vector<double>> gates(N);
      std::vector<double> mean(E, 0.0), load(E, 0.0);
      for (int t = 0; t < N; ++t) {
        double mx = -1e300;
        for (int e = 0; e < E; ++e) {
          double z = 0;
          for (int i = 0; i < H; ++i)
            z += hx(t, i) * wr[static_cast<std::size_t>(i * E + e)];
          prob[t][e] = z;
          mx = std::max(mx, z);
        }
        double s = 0;
        for (int e = 0; e < E; ++e)
          s += (prob[t][e] = std::exp(prob[t][e] - mx));
        for (int e = 0; e < E; ++e)
          mean[e] += (prob[t][e] /= s) / N;
        std::vector<int> order(E);
        for (int e = 0; e < E; ++e)
          order[e] = e;
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return prob[t][a] > prob[t][b]; });
        double sel = 0;
        for (int j = 0; j < k; ++j)
          sel += prob[t][order[j]];
        for (int j = 0; j < k; ++j) {
          chosen[t].push_back(order[j]);
          gates[t].push_back(prob[t][order[j]] / sel);
          load[order[j]] += 1.0 / (N * k);
        }
      }
      const long cap = c > 0 ? static_cast<long>(std::ceil(c * N * k / E)) : N * k;
      std::vector<long> taken(E, 0);
      std::vector<std::vector<bool>> kept(N, std::vector<bool>(k));
      int dropped = 0;
      for (int j = 0; j < k; ++j)
        for (int t = 0; t < N; ++t) {
          kept[t][j] = taken[chosen[t][j]]++ < cap;
          dropped += kept[t][j] ? 0 : 1;
        }
      if (c == 0.5)
        EXPECT_GT(dropped, 0);
      if (c == 0.0)
        EXPECT_EQ(dropped, 0);
      double worst = 0;
      for (int t = 0; t < N; ++t) {
        std::vector<double> want(H, 0.0);
        for (int j = 0; j < k; ++j) {
          if (!kept[t][j])
            continue;
          const auto e = static_cast<std::size_t>(chosen[t][j]);
          const std::vector<double> w1 = get(n.ew1[e]), b1 = get(n.eb1[e]), w2 = get(n.ew2[e]),
                                    b2 = get(n.eb2[e]);
          std::vector<double> g(F);
          for (int f = 0; f < F; ++f) {
            double z = b1[static_cast<std::size_t>(f)];
            for (int i = 0; i < H; ++i)
              z += hx(t, i) * w1[static_cast<std::size_t>(i * F + f)];
            g[f] = 0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
          }
          for (int i = 0; i < H; ++i) {
            double z = b2[static_cast<std::size_t>(i)];
            for (int f = 0; f < F; ++f)
              z += g[f] * w2[static_cast<std::size_t>(f * H + i)];
            want[i] += gates[t][j] * z;
          }
        }
        for (int i = 0; i < H; ++i)
          worst = std::max(worst, std::fabs(got[static_cast<std::size_t>(t * H + i)] - want[i]));
      }
      EXPECT_LT(worst, 1e-12);
      double want_aux = 0;
      for (int e = 0; e < E; ++e)
        want_aux += load[e] * mean[e];
      want_aux *= coef * E;
      EXPECT_NEAR(host(aux)[0] / N, want_aux, 1e-14);
    }
}

// Every parameter's gradient (router, experts, attention, embeddings) against central
// differences of (cross-entropy + aux loss), dropless and with dropped tokens, for top-1
// and top-2 and with MoE in every other layer.
TEST(MoE, EveryGradientMatchesFiniteDifferences) {
  struct Case {
    int experts, top_k, every;
    double capacity;
  };
  for (const Case& k : {Case{4, 2, 1, 0.0}, Case{3, 1, 1, 0.0}, Case{4, 2, 2, 0.6}}) {
    SCOPED_TRACE("experts " + std::to_string(k.experts) + " top_k " + std::to_string(k.top_k) +
                 " moe_every " + std::to_string(k.every) + " capacity " +
                 std::to_string(k.capacity));
    ModelConfig c = moe_model(k.experts, k.top_k, k.capacity, 0.3);
    c.moe_every = k.every;
    const int batch = 2;
    auto net = model::GridModel<double>::single(c, batch, 7);
    randomise(*net.model, 3);
    const int n = batch * c.seq_len;
    const auto in = random_tokens(n, c.vocab_size, 1), tgt = random_tokens(n, c.vocab_size, 2);
    std::string name;
    const double worst = worst_gradient_error(*net.model, in, tgt, name);
    EXPECT_LT(worst, 1e-6) << "worst at " << name;
  }
}

// A capacity no expert reaches gives the dropless results bitwise.
TEST(MoE, LargeCapacityEqualsDropless) {
  const int batch = 2;
  auto a = model::GridModel<double>::single(moe_model(4, 2, 0.0), batch, 9);
  auto b = model::GridModel<double>::single(moe_model(4, 2, 4.0), batch, 9);
  randomise(*a.model, 5);
  randomise(*b.model, 5);
  const int n = batch * 4;
  const auto in = random_tokens(n, 11, 3), tgt = random_tokens(n, 11, 4);
  a.model->zero_grad();
  b.model->zero_grad();
  EXPECT_EQ(a.model->forward_backward(ExecSpace(), in, tgt, 0.1),
            b.model->forward_backward(ExecSpace(), in, tgt, 0.1));
  EXPECT_EQ(a.model->take_aux_sum(), b.model->take_aux_sum());
  for (std::size_t i = 0; i < a.model->params().size(); ++i)
    EXPECT_EQ(host(a.model->params()[i].grad), host(b.model->params()[i].grad))
        << a.model->params()[i].name;
}

// experts = 1 is the dense model: same parameters, same loss and gradients; and E
// identical experts with top_k = E compute the dense MLP (the gates sum to 1).
TEST(MoE, OneExpertAndIdenticalExpertsEqualTheDenseModel) {
  const int batch = 2, n = batch * 4;
  const auto in = random_tokens(n, 11, 5), tgt = random_tokens(n, 11, 6);
  auto dense = model::GridModel<double>::single(moe_model(0, 2), batch, 4);
  auto one = model::GridModel<double>::single(moe_model(1, 1), batch, 4);
  ASSERT_EQ(dense.model->params().size(), one.model->params().size());
  dense.model->zero_grad();
  one.model->zero_grad();
  EXPECT_EQ(dense.model->forward_backward(ExecSpace(), in, tgt, 0.5),
            one.model->forward_backward(ExecSpace(), in, tgt, 0.5));
  for (std::size_t i = 0; i < dense.model->params().size(); ++i) {
    EXPECT_EQ(dense.model->params()[i].name, one.model->params()[i].name);
    EXPECT_EQ(host(dense.model->params()[i].grad), host(one.model->params()[i].grad));
  }
  EXPECT_EQ(one.model->take_aux_sum(), 0.0);

  auto moe = model::GridModel<double>::single(moe_model(3, 3, 0.0, 0.0), batch, 4);
  for (auto& p : moe.model->params()) {
    std::string name = p.name;
    const auto at = name.find("moe/experts/");
    if (at != std::string::npos) // layers/<l>/moe/experts/<e>/w1 -> layers/<l>/mlp/w1
      name = name.substr(0, at) + "mlp/" + name.substr(name.rfind('/') + 1);
    if (name.find("router") != std::string::npos)
      continue; // any router: the gates sum to 1
    Kokkos::deep_copy(p.value, dense.model->param(name).value);
  }
  const double want = dense.model->forward_backward(ExecSpace(), in, tgt, 0.0);
  EXPECT_NEAR(moe.model->forward_backward(ExecSpace(), in, tgt, 0.0), want,
              1e-12 * std::fabs(want));
}

namespace {

std::string deck_text(const std::string& model_extra, const std::string& parallel = "",
                      int steps = 10) {
  return DeckText()
      .set("model.seq_len", 16)
      .lines("model", model_extra)
      .lines("parallel", parallel)
      .set("train.seed", 5)
      .set("train.steps", steps)
      .set("optimizer.lr", 1e-2)
      .set("optimizer.min_lr", 1e-3)
      .set("optimizer.warmup_steps", 2)
      .set("data.format", "synthetic")
      .set("data.synthetic_tokens", 20000)
      .set("data.synthetic_branching", 2)
      .str();
}

Deck moe_deck(const std::string& extra = "", const std::string& parallel = "") {
  const std::string k = extra.find("top_k") == std::string::npos ? "top_k = 2\n" : "";
  return cost::parse_deck(deck_text("experts = 4\n" + k + extra, parallel), "moe.toml");
}

} // namespace

// Ten AdamW steps lower the loss; a run resumed from a checkpoint after five steps
// continues with the same losses bitwise.
TEST(MoE, TrainingLearnsAndResumesBitwise) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("cubelm_test_moe_" + std::to_string(::getpid()) + ".h5"))
                               .string();
  train::Trainer straight(moe_deck()), first(moe_deck());
  std::vector<double> losses, aux;
  for (int s = 0; s < 10; ++s) {
    const train::StepMetrics m = straight.step();
    losses.push_back(m.loss);
    aux.push_back(m.aux_loss);
    EXPECT_TRUE(m.moe);
  }
  EXPECT_LT(losses.back(), losses.front() - 0.3);
  // Near-uniform routing at initialisation: each of the two MoE blocks adds about the
  // coefficient (0.01).
  EXPECT_NEAR(aux.front(), 0.02, 0.002);
  for (int s = 0; s < 5; ++s)
    EXPECT_EQ(first.step().loss, losses[static_cast<std::size_t>(s)]);
  first.save(path);
  train::Trainer second(moe_deck());
  second.resume(path);
  for (int s = 5; s < 10; ++s) {
    const train::StepMetrics m = second.step();
    EXPECT_EQ(m.loss, losses[static_cast<std::size_t>(s)]) << "step " << s;
    EXPECT_EQ(m.aux_loss, aux[static_cast<std::size_t>(s)]) << "step " << s;
  }
  EXPECT_NE(train::format_json(straight.step()).find("\"aux_loss\""), std::string::npos);
  std::filesystem::remove(path);
}

// The estimate `cubelm check` prints equals what the process allocates.
TEST(MoE, MemoryEstimateEqualsTheAllocation) {
  for (const auto& [extra, parallel] : std::vector<std::pair<std::string, std::string>>{
           {"", ""},
           {"capacity_factor = 1.25", ""},
           {"moe_every = 2\ntop_k = 1", "microbatches = 2"},
           {"", "recompute = \"full\""},
           {"moe_every = 2", "recompute = \"full\"\nmicrobatches = 2"}}) {
    SCOPED_TRACE(extra + " | " + parallel);
    const Deck deck = moe_deck(extra, parallel);
    train::Trainer t(deck);
    const cost::Memory measured = t.memory(), estimate = cost::estimate_memory(deck);
    EXPECT_EQ(measured.parameters, estimate.parameters);
    EXPECT_EQ(measured.gradients, estimate.gradients);
    EXPECT_EQ(measured.optimizer, estimate.optimizer);
    EXPECT_EQ(measured.activations, estimate.activations);
    std::int64_t count = 0;
    for (const auto& p : t.model().params())
      count += p.size();
    EXPECT_EQ(count, cost::parameter_count(deck.model) +
                         (tp::padded_vocab(deck.model, comm::layout_of(deck.parallel)) -
                          deck.model.vocab_size) *
                             deck.model.hidden);
  }
}

// Bad keys name the key, its value and the rule; layouts other than one process are
// refused until expert parallelism exists.
TEST(MoE, DeckRules) {
  auto error = [](const std::string& model, const std::string& parallel = "") {
    try {
      cost::parse_deck(deck_text(model, parallel), "bad.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  std::string e = error("experts = -1");
  EXPECT_TRUE(has(e, "model.experts = -1: must be at least 0")) << e;
  e = error("experts = 4\ntop_k = 5");
  EXPECT_TRUE(has(e, "model.top_k = 5: must lie in [1, model.experts = 4]")) << e;
  e = error("experts = 4\ntop_k = 0");
  EXPECT_TRUE(has(e, "model.top_k = 0: must lie in")) << e;
  e = error("experts = 4\nmoe_every = 3");
  EXPECT_TRUE(has(e, "model.moe_every = 3: must lie in [1, model.layers = 2]")) << e;
  e = error("experts = 4\ncapacity_factor = -0.5");
  EXPECT_TRUE(has(e, "model.capacity_factor = -0.5: must be a finite number, at least 0")) << e;
  e = error("experts = 4\naux_loss = -1");
  EXPECT_TRUE(has(e, "model.aux_loss = -1: must be a finite number, at least 0")) << e;
  // Under 1d tensor parallelism the experts spread over the tensor ranks (and replicas):
  // expert_size is tensor_size times a divisor of data_size x context_size.
  e = error("experts = 4\ntop_k = 2", "tensor_mode = \"1d\"\ntensor_size = 2");
  EXPECT_TRUE(has(e,
                  "parallel.expert_size = 1 (default): must be tensor_size = 2 times a divisor of "
                  "data_size x context_size = 1 x 1 = 1") &&
              has(e, "valid: 2"))
      << e;
  e = error("experts = 4\ntop_k = 2", "tensor_mode = \"1d\"\ntensor_size = 2\ndata_size = 2\n"
                                      "expert_size = 3");
  EXPECT_TRUE(has(e, "parallel.expert_size = 3: must be tensor_size = 2") && has(e, "valid: 2, 4"))
      << e;
  EXPECT_EQ(error("experts = 4\ntop_k = 2", "tensor_mode = \"1d\"\ntensor_size = 2\n"
                                            "data_size = 2\nexpert_size = 4\n"
                                            "sequence_parallel = true"),
            "no error");
  // Expert parallelism: expert_size divides data_size and the experts, needs experts.
  e = error("experts = 4", "data_size = 2\nexpert_size = 4");
  EXPECT_TRUE(has(e, "parallel.expert_size = 4: must divide both data_size x context_size = 2 "
                     "x 1 = 2") &&
              has(e, "valid: 1, 2"))
      << e;
  e = error("experts = 6", "data_size = 4\nexpert_size = 4");
  EXPECT_TRUE(has(e, "model.experts = 6 (each rank holds as many experts); valid: 1, 2")) << e;
  e = error("", "data_size = 2\nexpert_size = 2");
  EXPECT_TRUE(has(e, "parallel.expert_size = 2: expert parallelism spreads the experts")) << e;
  e = error("experts = 4", "expert_size = 0");
  EXPECT_TRUE(has(e, "parallel.expert_size = 0: must be at least 1")) << e;
  EXPECT_EQ(error("experts = 4", "data_size = 4\nexpert_size = 2\nzero = 1"), "no error");
  EXPECT_EQ(error("experts = 4", "pipeline_size = 2\nmicrobatches = 2\ndata_size = 2\n"
                                 "expert_size = 2"),
            "no error");
  // Expert tensor parallelism: 1 or tensor_size; the experts then spread over replicas only.
  e = error("experts = 4", "tensor_mode = \"1d\"\ntensor_size = 2\nexpert_tensor_size = 3");
  EXPECT_TRUE(has(e, "parallel.expert_tensor_size = 3: must be 1 (whole experts) or "
                     "tensor_size = 2"))
      << e;
  e = error("", "tensor_mode = \"1d\"\ntensor_size = 2\nexpert_tensor_size = 2");
  EXPECT_TRUE(has(e, "parallel.expert_tensor_size = 2: splits the experts of MoE layers: it "
                     "needs model.experts > 1"))
      << e;
  EXPECT_EQ(error("experts = 4", "tensor_mode = \"1d\"\ntensor_size = 2\nexpert_tensor_size = 2"),
            "no error");
  e = error("experts = 4", "tensor_mode = \"1d\"\ntensor_size = 2\nexpert_tensor_size = 2\n"
                           "data_size = 2\nexpert_size = 4");
  EXPECT_TRUE(has(e, "parallel.expert_size = 4: must divide both data_size x context_size = 2 x "
                     "1 = 2") &&
              has(e, "each tensor rank's apart") && has(e, "valid: 1, 2"))
      << e;
  EXPECT_EQ(error("experts = 4", "tensor_mode = \"2d\"\ntensor_size = 4\nexpert_tensor_size = 4\n"
                                 "data_size = 2\nexpert_size = 2"),
            "no error");
  // 2d and 3d alike: the experts spread over all the tensor ranks.
  e = error("experts = 4", "tensor_mode = \"2d\"\ntensor_size = 4");
  EXPECT_TRUE(has(e, "parallel.expert_size = 1 (default): must be tensor_size = 4 times a "
                     "divisor of data_size x context_size = 1 x 1 = 1") &&
              has(e, "valid: 4"))
      << e;
  EXPECT_EQ(error("experts = 4", "tensor_mode = \"2d\"\ntensor_size = 4\nexpert_size = 4"),
            "no error");
  EXPECT_EQ(error("experts = 8", "tensor_mode = \"3d\"\ntensor_size = 8\nexpert_size = 8"),
            "no error");
  EXPECT_EQ(error("experts = 4\ntop_k = 4\nmoe_every = 2\ncapacity_factor = 1.5\naux_loss = 0"),
            "no error");
  EXPECT_EQ(error("experts = 1"), "no error");
  // The dense defaults: nothing about experts changes an existing deck.
  const Deck d = cost::parse_deck(deck_text(""), "dense.toml");
  EXPECT_EQ(d.model.experts, 0);
  EXPECT_EQ(d.model.top_k, 2);
  EXPECT_EQ(d.model.moe_every, 1);
  EXPECT_EQ(d.model.capacity_factor, 0.0);
  EXPECT_EQ(d.model.aux_loss, 0.01);
}
