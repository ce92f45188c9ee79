#include "cubelm/io/deck.hpp"

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/error.hpp"

#include "toml_document.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace cubelm::io {

namespace {

// Levenshtein distance, to suggest the key a typo meant.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest(const std::string& word, const std::vector<std::string>& options) {
  std::string best;
  std::size_t best_d = 3; // suggest only near misses
  for (const auto& o : options) {
    const std::size_t d = edit_distance(word, o);
    if (d < best_d) {
      best_d = d;
      best = o;
    }
  }
  return best;
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i)
    s += (i ? ", " : "") + items[i];
  return s;
}

/// Reads one [table] of the deck, remembering which keys it understood.
class Section {
public:
  Section(const toml_doc::Value* table, std::string name, std::string source, DeckKeys& keys)
      : table_(table), name_(std::move(name)), source_(std::move(source)), keys_(keys) {
    if (table_)
      for (const auto& [key, node] : table_->members)
        keys_.add(name_ + "." + key, node.line, node.text);
  }

  void get(const char* key, int& out) {
    std::int64_t wide = out;
    get(key, wide);
    if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
      fail(key, "must fit a 32-bit integer");
    out = static_cast<int>(wide);
  }
  void get(const char* key, std::int64_t& out) {
    if (const Value* n = find(key)) {
      if (n->type != Type::integer)
        fail(key, "must be an integer, got " + type_text(*n));
      out = n->integer;
    }
  }
  void get(const char* key, double& out) {
    if (const Value* n = find(key)) {
      if (n->type == Type::integer)
        out = static_cast<double>(n->integer);
      else if (n->type == Type::floating)
        out = n->floating;
      else
        fail(key, "must be a number, got " + type_text(*n));
    }
  }
  void get(const char* key, bool& out) {
    if (const Value* n = find(key)) {
      if (n->type != Type::boolean)
        fail(key, "must be true or false, got " + type_text(*n));
      out = n->boolean;
    }
  }
  void get(const char* key, std::string& out) {
    if (const Value* n = find(key)) {
      if (n->type != Type::string)
        fail(key, "must be a string, got " + type_text(*n));
      out = n->string;
    }
  }
  void choice(const char* key, std::string& out, std::initializer_list<const char*> allowed) {
    get(key, out);
    std::vector<std::string> names(allowed.begin(), allowed.end());
    if (std::find(names.begin(), names.end(), out) == names.end())
      fail(key, "must be one of " + quoted(names));
  }

  /// Fails unless value >= least: "must be at least <least> (<note>)".
  template <class V>
  void at_least(const char* key, V value, V least, const std::string& note = "") const {
    if (!(value >= least)) {
      std::ostringstream rule;
      rule << "must be at least " << least << (note.empty() ? "" : " (" + note + ")");
      fail(key, rule.str());
    }
  }

  /// True when the deck sets `key`.
  bool has(const char* key) const { return table_ && table_->find(key); }

  /// Fails with the key's line and value when `ok` is false.
  void require(bool ok, const char* key, const std::string& rule) const {
    if (!ok)
      fail(key, rule);
  }

  /// Every key must have been read by now; anything else is a typo or unknown.
  void finish() const {
    if (!table_)
      return;
    for (const auto& [key, node] : table_->members) {
      if (std::find(known_.begin(), known_.end(), key) != known_.end())
        continue;
      std::string msg = location(&node) + "unknown key '" + name_ + "." + key + "'";
      const std::string hint = closest(key, known_);
      if (!hint.empty())
        msg += "; did you mean '" + hint + "'?";
      msg += " Keys of [" + name_ + "]: " + join(known_);
      throw Error(msg, true);
    }
  }

  /// Fails naming the key, its line and value; `fallback` is the value shown
  /// (as the default) when the deck does not set the key.
  [[noreturn]] void fail(const char* key, const std::string& rule,
                         const std::string& fallback = "") const {
    keys_.fail(name_ + "." + key, rule, fallback);
  }

private:
  using Value = toml_doc::Value;
  using Type = Value::Type;

  const Value* find(const char* key) {
    if (std::find(known_.begin(), known_.end(), key) == known_.end())
      known_.emplace_back(key);
    return table_ ? table_->find(key) : nullptr;
  }
  std::string location(const Value* n) const {
    if (n && n->line > 0)
      return source_ + ":" + std::to_string(n->line) + ": ";
    return source_ + ": ";
  }
  static std::string type_text(const Value& n) { return n.type_name + " " + n.text; }
  static std::string quoted(const std::vector<std::string>& names) {
    std::vector<std::string> q;
    for (const auto& n : names)
      q.push_back("\"" + n + "\"");
    return join(q);
  }

  const Value* table_;
  std::string name_;
  std::string source_;
  std::vector<std::string> known_;
  DeckKeys& keys_;
};

const char* const kSections[] = {"model", "parallel",   "train", "optimizer",
                                 "data",  "checkpoint", "log",   "eval"};

toml_doc::Value parse_toml(const std::string& text, const std::string& source) {
  toml_doc::Parsed parsed = toml_doc::parse(text, source);
  if (!parsed.ok)
    throw Error(source + ":" + std::to_string(parsed.line) + ":" + std::to_string(parsed.column) +
                    ": not valid TOML: " + parsed.error,
                true);
  return std::move(parsed.root);
}

} // namespace

void DeckKeys::add(const std::string& key, int line, std::string text) {
  written_[key] = {line, std::move(text)};
}

void DeckKeys::fail(const std::string& key, const std::string& rule,
                    const std::string& fallback) const {
  const auto at = written_.find(key);
  std::string msg = source_;
  if (at != written_.end() && at->second.first > 0)
    msg += ":" + std::to_string(at->second.first);
  msg += ": " + key;
  if (at != written_.end())
    msg += " = " + at->second.second;
  else if (!fallback.empty())
    msg += " = " + fallback + " (default)";
  throw Error(msg + ": " + rule, true);
}

ReadDeck read_deck(const std::string& text, const std::string& source) {
  const toml_doc::Value root = parse_toml(text, source);
  std::vector<std::string> sections(std::begin(kSections), std::end(kSections));
  for (const auto& [key, node] : root.members) {
    const std::string line = node.line > 0 ? ":" + std::to_string(node.line) : "";
    if (std::find(sections.begin(), sections.end(), key) == sections.end()) {
      std::string msg = source + line + ": unknown section [" + key + "]";
      const std::string hint = closest(key, sections);
      if (!hint.empty())
        msg += "; did you mean [" + hint + "]?";
      throw Error(msg + " Sections: " + join(sections), true);
    }
    if (node.type != toml_doc::Value::Type::table)
      throw Error(source + line + ": '" + key + "' must be a table ([" + key + "])", true);
  }
  ReadDeck read{Deck{}, DeckKeys(source)};
  auto section = [&](const char* name) {
    return Section(root.find(name), name, source, read.keys);
  };

  Deck& deck = read.deck;
  deck.source = source;
  deck.text = text;

  Section model = section("model");
  ModelConfig& m = deck.model;
  model.get("vocab_size", m.vocab_size);
  model.get("vocab_divisible_by", m.vocab_divisible_by);
  model.get("seq_len", m.seq_len);
  model.get("hidden", m.hidden);
  model.get("heads", m.heads);
  model.get("layers", m.layers);
  model.at_least("vocab_size", m.vocab_size, 2);
  model.at_least("vocab_divisible_by", m.vocab_divisible_by, 1);
  model.at_least("seq_len", m.seq_len, 1);
  model.at_least("hidden", m.hidden, 1);
  model.at_least("heads", m.heads, 1);
  model.at_least("layers", m.layers, 1);
  model.require(m.hidden % m.heads == 0, "hidden",
                "must be divisible by model.heads = " + std::to_string(m.heads) +
                    " (each head gets hidden/heads features)");
  // Mixture-of-Experts feed-forward (docs/model.md).
  model.get("experts", m.experts);
  model.get("top_k", m.top_k);
  model.get("moe_every", m.moe_every);
  model.get("capacity_factor", m.capacity_factor);
  model.get("aux_loss", m.aux_loss);
  model.at_least("experts", m.experts, 0, "0 or 1: the dense MLP in every layer");
  if (m.top_k < 1 || (m.experts > 1 && m.top_k > m.experts))
    model.fail("top_k",
               "must lie in [1, model.experts = " + std::to_string(std::max(m.experts, 1)) +
                   "] (experts each token is routed to)",
               std::to_string(m.top_k));
  if (m.moe_every < 1 || (m.experts > 1 && m.moe_every > m.layers))
    model.fail("moe_every",
               "must lie in [1, model.layers = " + std::to_string(m.layers) +
                   "] (layers moe_every - 1, 2 moe_every - 1, ... counted from 0 are MoE layers)",
               std::to_string(m.moe_every));
  model.require(std::isfinite(m.capacity_factor) && m.capacity_factor >= 0, "capacity_factor",
                "must be a finite number, at least 0 (0: dropless; c > 0: each expert takes at "
                "most ceil(c x tokens x top_k / experts) tokens)");
  model.require(std::isfinite(m.aux_loss) && m.aux_loss >= 0, "aux_loss",
                "must be a finite number, at least 0 (the load-balancing loss coefficient)");
  model.finish();

  Section par = section("parallel");
  ParallelConfig& p = deck.parallel;
  std::string mode = mode_name(p.tensor_mode);
  par.choice("tensor_mode", mode, {"none", "1d", "2d", "3d"});
  p.tensor_mode = *parse_mode(mode);
  par.get("tensor_size", p.tensor_size);
  par.get("pipeline_size", p.pipeline_size);
  par.get("data_size", p.data_size);
  std::string schedule = schedule_name(p.schedule);
  par.choice("schedule", schedule, {"gpipe", "1f1b", "interleaved", "layered"});
  p.schedule = *parse_schedule(schedule);
  par.get("virtual_stages", p.virtual_stages);
  par.get("microbatches", p.microbatches);
  par.get("zero", p.zero);
  par.get("sequence_parallel", p.sequence_parallel);
  par.get("expert_size", p.expert_size);
  par.get("expert_tensor_size", p.expert_tensor_size);
  par.get("context_size", p.context_size);
  std::string recompute = recompute_name(p.recompute);
  par.choice("recompute", recompute, {"none", "full"});
  p.recompute = *parse_recompute(recompute);
  par.get("bucket_mb", p.bucket_mb);
  par.require(p.bucket_mb > 0, "bucket_mb", "must be positive (MB per gradient bucket)");
  par.get("timeout_s", p.timeout_s);
  par.require(std::isfinite(p.timeout_s) && p.timeout_s >= 0, "timeout_s",
              "must be a finite number of seconds, at least 0 (0 switches the hang watchdog off)");
  par.require(p.zero == 0 || p.zero == 1, "zero", "must be 0 (off) or 1 (sharded optimizer)");
  par.require(!p.sequence_parallel || comm::splits_sequences(p.tensor_mode), "sequence_parallel",
              "sequence parallelism exists only for tensor_mode = \"1d\"");
  // Each size on its own; how they fit together, the model and the batch is the layout's
  // rule (cost/deck.hpp).
  for (const auto& [key, value] : {std::pair<const char*, int>{"tensor_size", p.tensor_size},
                                   {"pipeline_size", p.pipeline_size},
                                   {"data_size", p.data_size},
                                   {"context_size", p.context_size},
                                   {"expert_size", p.expert_size},
                                   {"expert_tensor_size", p.expert_tensor_size},
                                   {"virtual_stages", p.virtual_stages},
                                   {"microbatches", p.microbatches}})
    par.at_least(key, value, 1);
  par.finish();

  Section train = section("train");
  TrainConfig& t = deck.train;
  train.get("steps", t.steps);
  train.get("global_batch", t.global_batch);
  train.get("seed", t.seed);
  train.get("max_bad_steps", t.max_bad_steps);
  train.get("time_limit_s", t.time_limit_s);
  std::string precision = precision_name(t.precision);
  train.choice("precision", precision, {"fp32", "tf32", "bf16"});
  t.precision = *parse_precision(precision);
  train.at_least("steps", t.steps, 0);
  train.at_least("global_batch", t.global_batch, 1);
  train.at_least("max_bad_steps", t.max_bad_steps, 1);
  train.at_least("time_limit_s", t.time_limit_s, 0.0, "0: no limit");
  const int per_step = p.data_size * p.microbatches;
  train.require(t.global_batch % per_step == 0, "global_batch",
                "must be divisible by parallel.data_size x parallel.microbatches = " +
                    std::to_string(p.data_size) + " x " + std::to_string(p.microbatches) + " = " +
                    std::to_string(per_step) +
                    " (global_batch = data_size x microbatches x micro-batch size)");
  train.finish();

  Section opt = section("optimizer");
  OptimizerConfig& o = deck.optimizer;
  opt.get("lr", o.lr);
  o.min_lr = o.lr / 10.0;
  opt.get("min_lr", o.min_lr);
  opt.get("warmup_steps", o.warmup_steps);
  opt.get("weight_decay", o.weight_decay);
  opt.get("beta1", o.beta1);
  opt.get("beta2", o.beta2);
  opt.get("eps", o.eps);
  opt.get("grad_clip", o.grad_clip);
  opt.require(o.lr > 0.0, "lr", "must be positive");
  opt.require(o.min_lr >= 0.0 && o.min_lr <= o.lr, "min_lr", "must lie in [0, optimizer.lr]");
  opt.at_least("warmup_steps", o.warmup_steps, 0);
  opt.at_least("weight_decay", o.weight_decay, 0.0);
  opt.require(o.beta1 >= 0.0 && o.beta1 < 1.0, "beta1", "must lie in [0, 1)");
  opt.require(o.beta2 >= 0.0 && o.beta2 < 1.0, "beta2", "must lie in [0, 1)");
  opt.require(o.eps > 0.0, "eps", "must be positive");
  opt.at_least("grad_clip", o.grad_clip, 0.0, "0 switches clipping off");
  opt.finish();

  Section data = section("data");
  DataConfig& d = deck.data;
  data.choice("format", d.format, {"synthetic", "llmc", "megatron", "text"});
  data.get("path", d.path);
  data.choice("sampler", d.sampler, {"sequential", "shuffle"});
  data.get("synthetic_tokens", d.synthetic_tokens);
  data.get("synthetic_branching", d.synthetic_branching);
  data.get("val_path", d.val_path);
  data.get("val_fraction", d.val_fraction);
  data.require(d.synthetic_tokens >= m.seq_len + 2, "synthetic_tokens",
               "must be at least model.seq_len + 2 = " + std::to_string(m.seq_len + 2));
  data.require(d.synthetic_branching >= 1 && d.synthetic_branching <= m.vocab_size,
               "synthetic_branching",
               "must lie in [1, model.vocab_size = " + std::to_string(m.vocab_size) + "]");
  if (d.format != "synthetic" && d.path.empty())
    data.fail("format", "needs data.path (the token or text file to read)");
  data.require(d.val_fraction >= 0.0 && d.val_fraction <= 0.5, "val_fraction",
               "must lie in [0, 0.5] (0: no validation tokens taken from the training file)");
  if (!d.val_path.empty() && d.val_fraction > 0)
    data.fail("val_path", "and data.val_fraction both name validation tokens: set one of them");
  if (!d.val_path.empty() && d.format == "synthetic")
    data.fail("val_path", "is a token file of data.format, which is \"synthetic\" here: set "
                          "data.val_fraction to hold out part of the synthetic corpus instead");
  data.finish();

  Section ckpt = section("checkpoint");
  CheckpointConfig& c = deck.checkpoint;
  // A deck file's own directory by default, checkpoints/<its name without .toml>: two
  // decks run from one directory keep their checkpoints apart
  // (docs/reliability.md#whose-checkpoint).
  if (source != "<string>" && !std::filesystem::path(source).stem().empty())
    c.dir = "checkpoints/" + std::filesystem::path(source).stem().string();
  ckpt.get("dir", c.dir);
  ckpt.get("interval", c.interval);
  ckpt.get("keep", c.keep);
  ckpt.get("resume", c.resume);
  ckpt.get("allow_other_run", c.allow_other_run);
  ckpt.get("async", c.async);
  ckpt.choice("on_error", c.on_error, {"fail", "warn"});
  ckpt.choice("writers", c.writers, {"all", "one"});
  ckpt.require(!c.dir.empty(), "dir", "must not be empty");
  ckpt.at_least("interval", c.interval, 0, "0: only at the end");
  ckpt.at_least("keep", c.keep, 0, "0: keep all");
  ckpt.require(!c.resume.empty(), "resume", "must be \"none\", \"auto\" or a file name");
  ckpt.finish();

  Section log = section("log");
  LogConfig& l = deck.log;
  log.get("interval", l.interval);
  log.get("metrics", l.metrics);
  log.get("peak_gflops", l.peak_gflops);
  log.at_least("peak_gflops", l.peak_gflops, 0.0, "0: measure at start-up");
  log.at_least("interval", l.interval, 1);
  log.finish();

  Section eval = section("eval");
  EvalConfig& e = deck.eval;
  eval.get("interval", e.interval);
  eval.get("batches", e.batches);
  eval.at_least("interval", e.interval, 0, "0: at the end of the run only");
  eval.at_least("batches", e.batches, 1);
  for (const char* key : {"interval", "batches"})
    if (eval.has(key) && !d.validates())
      eval.fail(key, "needs validation tokens: set data.val_path or data.val_fraction");
  eval.finish();

  return read;
}

ReadDeck read_deck_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(path + ": cannot open the deck file (does it exist and is it readable?)", true);
  std::ostringstream text;
  text << in.rdbuf();
  return read_deck(text.str(), path);
}

} // namespace cubelm::io
