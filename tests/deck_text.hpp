#pragma once
// A deck written as TOML text for a test: the tiny model the tests share, with any key
// set over it, in one place instead of a hand-written deck per test file.
//
//   const Deck d = DeckText()
//                      .set("model.layers", 4)
//                      .lines("parallel", layout) // "key = value" lines (tests/layouts.hpp)
//                      .set("train.precision", "bf16")
//                      .deck("precision.toml");
//
// The defaults: [model] vocab_size 32, seq_len 8, hidden 16, heads 2, layers 2; [train]
// steps 10, global_batch 8; [data] synthetic_tokens 2000; [log] peak_gflops 1 (no
// start-up sgemm). Every other key keeps the deck's own default (docs/deck.md).

#include "cubelm/core/config.hpp"
#include "cubelm/cost/deck.hpp"

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace cubelm::testing {

class DeckText {
public:
  DeckText() {
    set("model.vocab_size", 32).set("model.seq_len", 8).set("model.hidden", 16);
    set("model.heads", 2).set("model.layers", 2);
    set("train.steps", 10).set("train.global_batch", 8);
    set("data.synthetic_tokens", 2000);
    set("log.peak_gflops", 1.0);
  }

  /// `key` ("section.name") = `value`, replacing an earlier value of the key.
  DeckText& set(const std::string& key, int value) { return raw(key, std::to_string(value)); }
  DeckText& set(const std::string& key, std::int64_t value) {
    return raw(key, std::to_string(value));
  }
  DeckText& set(const std::string& key, double value) {
    std::ostringstream text;
    text.precision(17);
    text << value;
    const std::string s = text.str();
    // A TOML float needs a point or an exponent: 1 is an integer, 1.0 a float.
    return raw(key, s.find_first_of(".eEn") == std::string::npos ? s + ".0" : s);
  }
  DeckText& set(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  /// A string value (quoted here).
  DeckText& set(const std::string& key, const std::string& value) {
    return raw(key, "\"" + value + "\"");
  }
  DeckText& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  /// The training of the layout-equality tests: AdamW at lr 1e-2 with 2 warm-up steps and
  /// clipping at 1, on 5000 synthetic tokens, from `seed`.
  DeckText& layout_training(int seed) {
    return set("train.seed", seed)
        .set("optimizer.lr", 1e-2)
        .set("optimizer.warmup_steps", 2)
        .set("optimizer.grad_clip", 1.0)
        .set("data.synthetic_tokens", 5000);
  }
  /// `key` = `toml`, a value written as TOML text.
  DeckText& raw(const std::string& key, const std::string& toml) {
    const std::size_t dot = key.find('.');
    Section& s = section(key.substr(0, dot));
    const std::string name = key.substr(dot + 1);
    for (auto& [k, v] : s.keys)
      if (k == name) {
        v = toml;
        return *this;
      }
    s.keys.emplace_back(name, toml);
    return *this;
  }
  /// Every "key = value" line of `text` into [section] (blank lines skipped).
  DeckText& lines(const std::string& section_name, const std::string& text) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      const std::size_t eq = line.find('=');
      if (eq == std::string::npos)
        continue;
      raw(section_name + "." + trim(line.substr(0, eq)), trim(line.substr(eq + 1)));
    }
    return *this;
  }
  /// The integer `key` holds, or `fallback` when it is not set.
  int get(const std::string& key, int fallback) const {
    const std::size_t dot = key.find('.');
    for (const Section& s : sections_)
      if (s.name == key.substr(0, dot))
        for (const auto& [k, v] : s.keys)
          if (k == key.substr(dot + 1))
            return std::stoi(v);
    return fallback;
  }
  /// Back to the deck's own default for `key`.
  DeckText& erase(const std::string& key) {
    const std::size_t dot = key.find('.');
    Section& s = section(key.substr(0, dot));
    const std::string name = key.substr(dot + 1);
    for (std::size_t i = 0; i < s.keys.size(); ++i)
      if (s.keys[i].first == name)
        s.keys.erase(s.keys.begin() + static_cast<std::ptrdiff_t>(i));
    return *this;
  }

  std::string str() const {
    std::string out;
    for (const Section& s : sections_) {
      out += "[" + s.name + "]\n";
      for (const auto& [k, v] : s.keys)
        out += k + " = " + v + "\n";
    }
    return out;
  }
  /// The deck, read and checked as `cubelm` does; `source` names it in messages.
  Deck deck(const std::string& source = "test.toml") const {
    return cost::parse_deck(str(), source);
  }

private:
  struct Section {
    std::string name;
    std::vector<std::pair<std::string, std::string>> keys;
  };
  Section& section(const std::string& name) {
    for (Section& s : sections_)
      if (s.name == name)
        return s;
    sections_.push_back(Section{name, {}});
    return sections_.back();
  }
  static std::string trim(const std::string& s) {
    const std::size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
  }

  std::vector<Section> sections_;
};

} // namespace cubelm::testing
