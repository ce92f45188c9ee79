// Generation with a key/value cache (docs/generate.md): the cached, one-position-at-a-time
// logits against a whole-sequence pass of the generator, and the cross-entropy of its
// logits against the training model's loss of the same sequence (dense and MoE, at
// step 0 and after 2 steps); a model trained on the synthetic Markov chain generates the
// chain's transitions with uniform successors; the sampler's rules (greedy ties, top-k,
// top-p, temperature, seeds) against closed forms; bad inputs.

#include "cubelm/core/error.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/sampler.hpp"
#include "cubelm/io/synthetic.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/model/generator.hpp"
#include "cubelm/model/sampling.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;

namespace {

// A tiny fp32 model trained on an llm.c file of random tokens, one sequence a step, taken
// in order (the sequential sampler): step s reads the tokens of window s.
DeckText tiny_deck(const std::string& tokens_file) {
  return DeckText()
      .set("model.vocab_size", 64)
      .set("model.seq_len", 12)
      .set("model.hidden", 32)
      .set("model.heads", 4)
      .set("model.layers", 2)
      .set("train.global_batch", 1)
      .set("train.seed", 3)
      .set("optimizer.lr", 1e-2)
      .set("optimizer.warmup_steps", 0)
      .set("data.format", "llmc")
      .set("data.path", tokens_file)
      .set("data.sampler", "sequential");
}

// The same with every second layer an MoE feed-forward of 4 experts, top 2, dropless.
DeckText moe_deck(const std::string& tokens_file) {
  return tiny_deck(tokens_file)
      .set("model.experts", 4)
      .set("model.top_k", 2)
      .set("model.moe_every", 2)
      .set("model.capacity_factor", 0.0);
}

// A token file of `n` random tokens below `vocab`, written once per test.
std::string token_file(const char* stem, int n, int vocab) {
  std::string path = cubelm::testing::temp_path(stem);
  path.replace(path.size() - 3, 3, ".bin");
  io::write_llmc(path, cubelm::testing::random_tokens(n, vocab, 11));
  return path;
}

// The mean over positions of -log softmax(logits)[target], in double.
double mean_cross_entropy(const std::vector<float>& logits,
                          const std::vector<std::int32_t>& targets, int vocab) {
  double total = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const float* row = logits.data() + i * static_cast<std::size_t>(vocab);
    const double top = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int v = 0; v < vocab; ++v)
      sum += std::exp(row[v] - top);
    total += top + std::log(sum) - row[targets[i]];
  }
  return total / static_cast<double>(targets.size());
}

// Every token's logits, fed one position at a time through the cache.
std::vector<float> incremental_logits(model::Generator& g,
                                      const std::vector<std::int32_t>& tokens) {
  std::vector<float> all;
  for (const std::int32_t t : tokens) {
    const std::vector<float>& row = g.feed({t});
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// Checkpoints of `deck` after 0 and 2 steps.
std::vector<std::string> checkpoints(const Deck& deck, const std::string& stem) {
  const std::vector<std::string> paths = {cubelm::testing::temp_path((stem + "_0_").c_str()),
                                          cubelm::testing::temp_path((stem + "_2_").c_str())};
  train::Trainer t(deck, cubelm::testing::self());
  t.save(paths[0]);
  t.step();
  t.step();
  t.save(paths[1]);
  return paths;
}

} // namespace

// The cache gives the logits a pass over the whole sequence gives, position by position,
// and in pieces of 5 positions.
TEST(Generate, CachedLogitsEqualTheWholeSequence) {
  const std::string data = token_file("gen_cache", 400, 64);
  for (const DeckText& text : {tiny_deck(data), moe_deck(data)}) {
    const Deck deck = text.deck();
    for (const std::string& path : checkpoints(deck, "gen_cache")) {
      const io::CheckpointReader r(path, cubelm::testing::self());
      const ModelConfig m = model::checkpoint_model(r);
      EXPECT_EQ(m.hidden, 32);
      EXPECT_EQ(m.experts, deck.model.experts);
      const std::vector<std::int32_t> seq = cubelm::testing::random_tokens(m.seq_len, 64, 5);
      model::Generator whole(r, m, m.seq_len), one(r, m, 1), pieces(r, m, 5);
      const std::vector<float> expected = whole.feed_all(seq);
      ASSERT_EQ(expected.size(), seq.size() * 64);
      const double cached = max_abs_difference(incremental_logits(one, seq), expected),
                   in_pieces = max_abs_difference(pieces.feed_all(seq), expected);
      std::printf("experts %d, %s: max |logit difference| one at a time %.3g, in pieces %.3g\n",
                  m.experts, path.c_str(), cached, in_pieces);
      EXPECT_LT(cached, 1e-5) << path;
      EXPECT_LT(in_pieces, 1e-5) << path;
      // feed() returns the last position's logits; reset() starts over.
      one.reset();
      const std::vector<float> last = one.feed(seq);
      EXPECT_LT(max_abs_difference(last, std::vector<float>(expected.end() - 64, expected.end())),
                1e-5);
      EXPECT_EQ(one.position(), m.seq_len);
      std::remove(path.c_str());
    }
  }
  std::remove(data.c_str());
}

// The generator's cross-entropy of a training sequence equals the training model's loss
// of that sequence (its step's loss, taken before the update), at step 0 and after 2
// steps, dense and MoE: the same weights, read back from the checkpoint, and the same
// model, computed by other code (no tensor-parallel layers, no block attention).
TEST(Generate, CrossEntropyEqualsTheTrainingLoss) {
  const std::string data = token_file("gen_loss", 400, 64);
  const std::vector<std::int32_t> corpus = io::read_llmc(data, 64);
  for (const DeckText& text : {tiny_deck(data), moe_deck(data)}) {
    const Deck deck = text.deck();
    for (const std::string& path : checkpoints(deck, "gen_loss")) {
      train::Trainer t(deck, cubelm::testing::self());
      t.resume(path);
      const int step = t.steps_done();
      const double training_loss = t.step().loss;
      io::Batch batch;
      io::SequentialSampler(static_cast<std::int64_t>(corpus.size()), 1, deck.model.seq_len)
          .fill(corpus, step, batch);

      const io::CheckpointReader r(path, cubelm::testing::self());
      model::Generator g(r, model::checkpoint_model(r), 1);
      const double loss =
          mean_cross_entropy(incremental_logits(g, batch.inputs), batch.targets, 64);
      std::printf("experts %d, step %d: generator %.9f, training %.9f, relative difference "
                  "%.3g\n",
                  deck.model.experts, step, loss, training_loss,
                  std::fabs(loss - training_loss) / training_loss);
      EXPECT_NEAR(loss, training_loss, 1e-5 * training_loss)
          << path << " (step " << step << ", experts " << deck.model.experts << ")";
      std::remove(path.c_str());
    }
  }
  std::remove(data.c_str());
}

namespace {

// The upper `q` quantile of the chi-square distribution with k degrees of freedom, by
// Wilson and Hilferty's cube-root normal approximation (z: the normal quantile of q);
// within 1% of the exact quantile for k >= 3 at q = 0.999.
double chi_square_quantile(double k, double z) {
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

} // namespace

// A model trained to near the entropy floor of the synthetic chain (16 tokens, 3
// successors each) generates, sampled at temperature 1, the chain's transitions: at least
// 90% of them a -> b with b a successor of a (a perfect model: all), and with the
// successors of each token equally frequent: the chi-square statistic of the successor
// counts against uniform stays below its 0.999 quantile. The model's own probabilities
// differ from 1/3 by a little (its loss is about 0.02 above the floor), which raises the
// statistic's mean by a few units over some 900 transitions, well inside the margin.
TEST(Generate, SamplesTheSyntheticChain) {
  const int vocab = 16, branching = 3, seed = 7;
  const Deck deck = DeckText()
                        .set("model.vocab_size", vocab)
                        .set("model.seq_len", 32)
                        .set("model.hidden", 32)
                        .set("model.heads", 2)
                        .set("model.layers", 1)
                        .set("train.global_batch", 8)
                        .set("train.steps", 600)
                        .set("train.seed", seed)
                        .set("optimizer.lr", 1e-2)
                        .set("optimizer.min_lr", 1e-3)
                        .set("optimizer.warmup_steps", 10)
                        .set("data.synthetic_tokens", 20000)
                        .set("data.synthetic_branching", branching)
                        .deck();
  train::Trainer t(deck, cubelm::testing::self());
  double loss = 0;
  for (int s = 0; s < deck.train.steps; ++s)
    loss = t.step().loss;
  EXPECT_LT(loss - std::log(3.0), 0.05) << "the model did not learn the chain";
  const std::string path = cubelm::testing::temp_path("gen_chain");
  t.save(path);

  const std::vector<std::int32_t> succ = io::synthetic_successors(vocab, branching, seed);
  const std::vector<std::int32_t> corpus =
      io::make_synthetic_corpus(vocab, 2000, branching, static_cast<std::uint64_t>(seed));
  const io::CheckpointReader r(path, cubelm::testing::self());
  model::Generator g(r, model::checkpoint_model(r), 1);
  model::TokenSampler sampler({1.0, 0, 1.0, 42});
  std::vector<std::vector<int>> counts(vocab, std::vector<int>(branching, 0));
  int transitions = 0, valid = 0;
  for (int run = 0; run < 30; ++run) {
    g.reset();
    std::int32_t a = corpus[static_cast<std::size_t>(run) * 61]; // a token the chain visits
    const std::vector<float>* logits = &g.feed({a});
    for (int i = 0; i + 1 < 32; ++i) {
      const std::int32_t b = sampler.next(logits->data(), vocab);
      ++transitions;
      for (int j = 0; j < branching; ++j)
        if (succ[static_cast<std::size_t>(a * branching + j)] == b) {
          ++valid;
          ++counts[a][j];
          break;
        }
      if (i + 2 < 32)
        logits = &g.feed({b});
      a = b;
    }
  }
  std::printf("final loss %.4f (floor %.4f); %d of %d transitions the chain's\n", loss,
              std::log(3.0), valid, transitions);
  EXPECT_GE(valid, 0.9 * transitions) << valid << " of " << transitions;
  double chi2 = 0;
  int df = 0;
  for (int a = 0; a < vocab; ++a) {
    int n = 0;
    for (int c : counts[a])
      n += c;
    if (n == 0)
      continue;
    df += branching - 1;
    const double expected = static_cast<double>(n) / branching;
    for (int c : counts[a])
      chi2 += (c - expected) * (c - expected) / expected;
  }
  ASSERT_GT(df, 0);
  std::printf("chi-square %.2f on %d degrees of freedom (0.999 quantile %.2f)\n", chi2, df,
              chi_square_quantile(df, 3.0902));
  EXPECT_LT(chi2, chi_square_quantile(df, 3.0902))
      << "chi-square " << chi2 << " on " << df << " degrees of freedom";
  std::remove(path.c_str());
}

// Errors a caller can cause: a token outside the vocabulary, more positions than the
// context; a checkpoint without a deck.
TEST(Generate, RefusesTokensAndPositionsOutsideTheModel) {
  const std::string data = token_file("gen_bad", 400, 64);
  const Deck deck = tiny_deck(data).deck();
  const std::string path = cubelm::testing::temp_path("gen_bad");
  {
    train::Trainer t(deck, cubelm::testing::self());
    t.save(path);
  }
  const io::CheckpointReader r(path, cubelm::testing::self());
  model::Generator g(r, model::checkpoint_model(r));
  EXPECT_EQ(cubelm::testing::error_of(
                [&] {
                  g.feed({1, 64});
                },
                false),
            "token 1 is 64, outside the vocabulary [0, 64)");
  EXPECT_EQ(g.position(), 0);
  g.feed(std::vector<std::int32_t>(12, 1));
  EXPECT_EQ(cubelm::testing::error_of([&] { g.feed({1}); }, false),
            "positions 12 to 12 do not fit the model's context: model.seq_len = 12 positions "
            "(0 to 11)");
  std::remove(path.c_str());
  std::remove(data.c_str());
}

namespace {

std::vector<float> random_logits(int n, unsigned seed) {
  std::vector<float> l(static_cast<std::size_t>(n));
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& x : l)
    x = normal(gen);
  return l;
}

// How often each token is drawn in `n` draws from `logits`.
std::vector<double> frequencies(model::TokenSampler& s, const std::vector<float>& logits, int n) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < n; ++i)
    f[static_cast<std::size_t>(s.next(logits.data(), static_cast<std::int64_t>(logits.size())))] +=
        1.0 / n;
  return f;
}

// Each frequency within 5 standard deviations of the binomial's around p.
void expect_frequencies(const std::vector<double>& f, const std::vector<double>& p, int n) {
  ASSERT_EQ(f.size(), p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(f[i], p[i], 5 * std::sqrt(p[i] * (1 - p[i]) / n) + 1e-12) << "token " << i;
}

} // namespace

TEST(Sampling, GreedyTakesTheLowestIdAmongEqualLogits) {
  const std::vector<float> l = {1, 3, 3, 2};
  EXPECT_EQ(model::TokenSampler::argmax(l.data(), 4), 1);
  model::TokenSampler greedy({0.0, 0, 1.0, 9});
  EXPECT_EQ(greedy.next(l.data(), 4), 1);
  // top-k 1 at any temperature, and a top-p below the first probability, are greedy too.
  model::TokenSampler k1({1.0, 1, 1.0, 9}), p_small({1.0, 0, 1e-6, 9});
  for (unsigned seed = 0; seed < 50; ++seed) {
    const std::vector<float> r = random_logits(100, seed);
    const std::int32_t best = model::TokenSampler::argmax(r.data(), 100);
    EXPECT_EQ(k1.next(r.data(), 100), best);
    EXPECT_EQ(p_small.next(r.data(), 100), best);
  }
  EXPECT_EQ(k1.next(l.data(), 4), 1);
}

TEST(Sampling, SeedsReproduce) {
  const std::vector<float> l = random_logits(50, 1);
  const auto draws = [&](std::uint64_t seed) {
    model::TokenSampler s({1.0, 0, 1.0, seed});
    std::vector<std::int32_t> out;
    for (int i = 0; i < 64; ++i)
      out.push_back(s.next(l.data(), 50));
    return out;
  };
  EXPECT_EQ(draws(5), draws(5));
  EXPECT_NE(draws(5), draws(6));
}

// Sampled frequencies against softmax(logits / T), restricted to the top k, and to the
// nucleus of top-p, in closed form.
TEST(Sampling, FrequenciesFollowTheFilteredSoftmax) {
  const int n = 20000;
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  std::vector<float> l;
  for (double x : p)
    l.push_back(static_cast<float>(std::log(x)));
  model::TokenSampler plain({1.0, 0, 1.0, 1});
  expect_frequencies(frequencies(plain, l, n), p, n);
  // Temperature 2: p^(1/2), normalised.
  std::vector<double> hot;
  double z = 0;
  for (double x : p)
    z += std::sqrt(x);
  for (double x : p)
    hot.push_back(std::sqrt(x) / z);
  model::TokenSampler warm({2.0, 0, 1.0, 2});
  expect_frequencies(frequencies(warm, l, n), hot, n);
  // top-k 3: the three most probable, renormalised.
  model::TokenSampler k3({1.0, 3, 1.0, 3});
  expect_frequencies(frequencies(k3, l, n), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, n);
  // top-p 0.7: 0.5 alone is short of it, 0.5 + 0.3 reaches it: two tokens.
  model::TokenSampler p07({1.0, 0, 0.7, 4});
  expect_frequencies(frequencies(p07, l, n), {0.5 / 0.8, 0.3 / 0.8, 0, 0}, n);
  // Both: top-k 3 first (0.5, 0.3, 0.15 of 0.95), then top-p 0.9 of that: 0.8 / 0.95 is
  // short, 0.95 / 0.95 reaches it: three tokens.
  model::TokenSampler both({1.0, 3, 0.9, 5});
  expect_frequencies(frequencies(both, l, n), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}, n);
}

TEST(Sampling, RefusesBadOptions) {
  EXPECT_EQ(model::check_sampling({1.0, 0, 1.0, 0}), "");
  EXPECT_EQ(model::check_sampling({0.0, 5, 0.5, 0}), "");
  EXPECT_EQ(model::check_sampling({-0.5, 0, 1.0, 0}),
            "--temperature -0.5: must be a finite number >= 0 (0 chooses the most probable "
            "token)");
  EXPECT_EQ(model::check_sampling({1.0, -1, 1.0, 0}),
            "--top-k -1: must be >= 0 (0 keeps every token)");
  EXPECT_EQ(model::check_sampling({1.0, 0, 0.0, 0}),
            "--top-p 0: must be in (0, 1] (1 keeps every token)");
  EXPECT_EQ(model::check_sampling({1.0, 0, 1.5, 0}),
            "--top-p 1.5: must be in (0, 1] (1 keeps every token)");
  EXPECT_EQ(model::check_sampling({1.0, 0, std::nan(""), 0}),
            "--top-p nan: must be in (0, 1] (1 keeps every token)");
  EXPECT_THROW(model::TokenSampler({1.0, -2, 1.0, 0}), Error);
  const std::vector<float> l = {0.0f, std::nanf("")};
  model::TokenSampler s({1.0, 0, 1.0, 0});
  EXPECT_EQ(cubelm::testing::error_of([&] { s.next(l.data(), 2); }, false),
            "logit of token 1 is NaN: the checkpoint's weights are not finite");
}
