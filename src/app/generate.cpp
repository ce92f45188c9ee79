#include "cubelm/app/generate.hpp"

#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/io/bpe.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/kernels/precision.hpp"
#include "cubelm/model/generator.hpp"
#include "cubelm/train/generation.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

namespace cubelm::app {

Codec codec_for(const ModelConfig& model, const std::string& vocab, const std::string& merges) {
  if (!vocab.empty()) {
    const io::Bpe bpe = io::Bpe::load("gpt2", vocab, merges);
    if (bpe.id_limit() > model.vocab_size)
      throw Error("--vocab " + bpe.source() + ": its ids go up to " +
                      std::to_string(bpe.id_limit() - 1) +
                      ", beyond the model's vocabulary "
                      "(model.vocab_size = " +
                      std::to_string(model.vocab_size) +
                      "): the checkpoint was not trained on this BPE's tokens",
                  true);
    // Shared by the two functions: an encoder keeps a cache (one thread here).
    const auto encoder = std::make_shared<io::BpeEncoder>(bpe);
    return Codec{"bpe", [encoder](const std::string& text) { return encoder->encode(text); },
                 [bpe](std::int32_t token) {
                   // Ids the BPE lacks (a padded vocabulary's) print as <id>.
                   return bpe.has(token) ? std::string(bpe.bytes_of(token))
                                         : "<" + std::to_string(token) + ">";
                 },
                 ""};
  }
  if (!merges.empty())
    throw Error("--merges " + merges + ": needs --vocab vocab.json", true);
  if (model.vocab_size == 256)
    return Codec{"bytes",
                 [](const std::string& text) {
                   std::vector<std::int32_t> ids;
                   for (const char c : text)
                     ids.push_back(static_cast<unsigned char>(c));
                   return ids;
                 },
                 [](std::int32_t token) { return std::string(1, static_cast<char>(token)); }, ""};
  const int size = model.vocab_size;
  return Codec{"ids",
               [size](const std::string&) -> std::vector<std::int32_t> {
                 throw Error("--prompt TEXT needs the byte vocabulary (model.vocab_size = 256) "
                             "or a BPE vocabulary (--vocab FILE); this checkpoint's model has "
                             "vocab_size = " +
                             std::to_string(size) +
                             ": give --vocab, or the prompt's token ids with --prompt-tokens "
                             "FILE");
               },
               [](std::int32_t token) { return std::to_string(token); }, " "};
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What a process of the job generates with: model::Generator (one process, key/value
// cache) or train::LayoutGenerator (--deck, the deck's layout).
struct Net {
  ModelConfig config;
  std::function<const std::vector<float>&(const std::vector<std::int32_t>&)> feed;
};

// The options, the model and the prompt, alike on every rank: their errors are the job's.
template <class F>
auto alike(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    if (!e.collective())
      throw Error(e.what(), true);
    throw;
  }
}

int generate(const GenerateOptions& o, const Environment& env) {
  const bool root = env.world_rank() == 0;
  // The options first: they cost nothing to check.
  alike([&] {
    const std::string bad = model::check_sampling(o.sampling);
    if (!bad.empty())
      throw Error(bad);
    if (o.tokens < 0)
      throw Error("--tokens " + std::to_string(o.tokens) + ": must be >= 0");
    if (o.prompt.has_value() == !o.prompt_tokens.empty())
      throw Error("give the prompt once: --prompt TEXT or --prompt-tokens FILE");
    if (o.deck.empty() && env.world_size() > 1)
      throw Error("cubelm generate without --deck runs on one process; this job has " +
                  std::to_string(env.world_size()) +
                  " (start it without mpiexec, or give --deck DECK to generate under its layout)");
  });
  // Checkpoints hold fp32 weights whatever precision trained them: generate in fp32.
  kernels::set_gemm_precision(Precision::fp32);
  std::unique_ptr<model::Generator> single;
  std::unique_ptr<train::LayoutGenerator> spread;
  Net net;
  if (o.deck.empty()) {
    alike([&] {
      const io::CheckpointReader reader(o.checkpoint, comm::Communicator::world());
      net.config = model::checkpoint_model(reader);
      single = std::make_unique<model::Generator>(reader, net.config);
    });
    net.feed = [&](const std::vector<std::int32_t>& t) -> const std::vector<float>& {
      return single->feed(t);
    };
  } else {
    const Deck deck = alike([&] { return cost::load_deck(o.deck); });
    spread = std::make_unique<train::LayoutGenerator>(deck, o.checkpoint);
    net.config = spread->config();
    net.feed = [&](const std::vector<std::int32_t>& t) -> const std::vector<float>& {
      return spread->feed(t);
    };
  }
  const ModelConfig& config = net.config;
  const Codec codec = alike([&] { return codec_for(config, o.vocab, o.merges); });
  const std::vector<std::int32_t> prompt = alike([&] {
    const std::vector<std::int32_t> ids =
        o.prompt.has_value() ? codec.encode(*o.prompt)
                             : io::read_token_ids(o.prompt_tokens, config.vocab_size);
    const std::string source = o.prompt.has_value() ? "--prompt" : o.prompt_tokens;
    if (ids.empty())
      throw Error(source + ": the prompt is empty: generation continues a prompt of at least one "
                           "token");
    const std::int64_t positions = static_cast<std::int64_t>(ids.size()) + o.tokens;
    if (positions > config.seq_len)
      throw Error("the prompt's " + std::to_string(ids.size()) + " tokens and --tokens " +
                  std::to_string(o.tokens) + " need " + std::to_string(positions) +
                  " positions, more than the model's context of model.seq_len = " +
                  std::to_string(config.seq_len) + " (checkpoint " + o.checkpoint + ")");
    return ids;
  });
  model::TokenSampler sampler(o.sampling);

  // One writer: rank 0 prints and writes --logits (every rank holds the same logits).
  std::ofstream logits_file;
  if (!o.logits.empty() && root) {
    logits_file.open(o.logits, std::ios::binary | std::ios::trunc);
    if (!logits_file)
      throw Error("--logits " + o.logits + ": cannot open the file for writing");
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &net.feed(prompt);
  const double prompt_s = seconds_since(start);
  const auto steps = std::chrono::steady_clock::now();
  for (int i = 0; i < o.tokens; ++i) {
    if (logits_file.is_open()) // float is IEEE binary32, little-endian where cubelm runs
      logits_file.write(reinterpret_cast<const char*>(logits->data()),
                        static_cast<std::streamsize>(sizeof(float)) * config.vocab_size);
    const std::int32_t token = sampler.next(logits->data(), config.vocab_size);
    if (root) {
      const std::string text = (i == 0 ? "" : codec.separator) + codec.decode(token);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    if (i + 1 < o.tokens)
      logits = &net.feed({token});
  }
  const double gen_s = seconds_since(steps);
  if (logits_file.is_open() && !logits_file.flush())
    throw Error("--logits " + o.logits + ": writing failed (is the disk full?)");
  if (!root)
    return 0;
  if (o.tokens > 0)
    std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "cubelm: generated %d tokens in %.3f s: %.2f tokens/s (prompt of %zu tokens in "
               "%.3f s)%s\n",
               o.tokens, gen_s, gen_s > 0 ? o.tokens / gen_s : 0.0, prompt.size(), prompt_s,
               spread ? (", " + std::to_string(env.world_size()) + " process" +
                         (env.world_size() == 1 ? "" : "es") + " under the layout of " + o.deck)
                            .c_str()
                      : "");
  return 0;
}

} // namespace

int run_generate(const GenerateOptions& options, const Environment& env) {
  if (env.world_size() > 1)
    return generate(options, env);
  try {
    return generate(options, env);
  } catch (const Error& e) {
    // One process: every error is the whole job's, reported as such (no rank number).
    if (!e.collective())
      throw Error(e.what(), true);
    throw;
  }
}

} // namespace cubelm::app
