// Machine files: a small TOML schema read with the same strictness as decks (unknown
// sections and keys, wrong types and impossible values name the file, the line, the key,
// the value and the rule), so that a typo never silently leaves a default in a prediction.

#include "cubelm/io/machine.hpp"

#include "cubelm/core/error.hpp"

#include "toml_document.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

namespace cubelm::io {

double Machine::peak_flops(Precision precision) const {
  switch (precision) {
  case Precision::fp32:
    return peak_tflops_fp32 * 1e12;
  case Precision::tf32:
    return peak_tflops_tf32 * 1e12;
  case Precision::bf16:
    return peak_tflops_bf16 * 1e12;
  }
  return peak_tflops_fp32 * 1e12;
}

namespace {

using Value = toml_doc::Value;

// One [table] of a machine file; remembers the keys it read, to refuse the others.
class Table {
public:
  // Refuses at once any key not in `keys`: a misspelt key is named as such rather than
  // reported as the missing one it was meant to be.
  Table(const Value* table, std::string name, std::string source, std::vector<std::string> keys)
      : table_(table), name_(std::move(name)), source_(std::move(source)),
        allowed_(std::move(keys)) {
    if (!table_)
      return;
    for (const auto& [key, v] : table_->members)
      if (std::find(allowed_.begin(), allowed_.end(), key) == allowed_.end()) {
        std::string list;
        for (const auto& k : allowed_)
          list += (list.empty() ? "" : ", ") + k;
        throw Error(where(&v) + "unknown key '" + name_ + "." + key + "'; keys of [" + name_ +
                        "]: " + list,
                    true);
      }
  }

  // A number that must be present and satisfy `ok`; `rule` says what ok means.
  template <class Ok>
  double number(const char* key, Ok ok, const std::string& rule) {
    const Value* v = table_ ? table_->find(key) : nullptr;
    if (!v)
      throw Error(source_ + ": missing " + name_ + "." + key + " (" + rule + ")", true);
    double x = 0;
    if (v->type == Value::Type::integer)
      x = static_cast<double>(v->integer);
    else if (v->type == Value::Type::floating)
      x = v->floating;
    else
      fail(v, key, "must be a number, got " + v->type_name + " " + v->text);
    if (!std::isfinite(x) || !ok(x))
      fail(v, key, rule);
    return x;
  }
  int integer(const char* key, int least) {
    const Value* v = table_ ? table_->find(key) : nullptr;
    if (!v)
      throw Error(source_ + ": missing " + name_ + "." + key, true);
    if (v->type != Value::Type::integer)
      fail(v, key, "must be an integer, got " + v->type_name + " " + v->text);
    if (v->integer < least || v->integer > 1 << 20)
      fail(v, key, "must be at least " + std::to_string(least));
    return static_cast<int>(v->integer);
  }
  bool has(const char* key) const { return table_ && table_->find(key); }
  std::string text(const char* key, const std::string& fallback) {
    const Value* v = table_ ? table_->find(key) : nullptr;
    if (!v)
      return fallback;
    if (v->type != Value::Type::string)
      fail(v, key, "must be a string, got " + v->type_name + " " + v->text);
    return v->string;
  }

private:
  std::string where(const Value* v) const {
    return source_ + (v && v->line > 0 ? ":" + std::to_string(v->line) : "") + ": ";
  }
  [[noreturn]] void fail(const Value* v, const char* key, const std::string& rule) const {
    throw Error(where(v) + name_ + "." + key + " = " + v->text + ": " + rule, true);
  }

  const Value* table_;
  std::string name_, source_;
  std::vector<std::string> allowed_;
};

const Value* section(const Value& root, const char* name, const std::string& source) {
  const Value* t = root.find(name);
  if (!t)
    throw Error(source + ": missing section [" + name + "] (docs/planner.md: machine files)", true);
  if (t->type != Value::Type::table)
    throw Error(source + ":" + std::to_string(t->line) + ": " + name + " must be a table", true);
  return t;
}

bool positive(double x) {
  return x > 0;
}

} // namespace

Machine parse_machine(const std::string& text, const std::string& source) {
  toml_doc::Parsed parsed = toml_doc::parse(text, source);
  if (!parsed.ok)
    throw Error(source + ":" + std::to_string(parsed.line) + ":" + std::to_string(parsed.column) +
                    ": not valid TOML: " + parsed.error,
                true);
  const Value& root = parsed.root;
  const char* const sections[] = {"machine", "peak_tflops", "network"};
  for (const auto& [name, v] : root.members)
    if (std::find_if(std::begin(sections), std::end(sections),
                     [&](const char* s) { return name == s; }) == std::end(sections))
      throw Error(source + ":" + std::to_string(v.line) + ": unknown section [" + name +
                      "]; a machine file has [machine], [peak_tflops], [network.intra_node] "
                      "and [network.inter_node]",
                  true);
  Machine m;
  m.source = source;
  Table machine(section(root, "machine", source), "machine", source,
                {"name", "devices_per_node", "memory_gib", "memory_gbs", "gemm_efficiency",
                 "checkpoint_gbs"});
  m.name = machine.text("name", source);
  m.devices_per_node = machine.integer("devices_per_node", 1);
  m.memory_gib = machine.number("memory_gib", positive, "must be positive: GiB per device");
  m.memory_gbs =
      machine.number("memory_gbs", positive, "must be positive: memory bandwidth per device, GB/s");
  m.gemm_efficiency = machine.number(
      "gemm_efficiency", [](double x) { return x > 0 && x <= 1; },
      "must be in (0, 1]: the share of the peak a layer's products reach");
  if (machine.has("checkpoint_gbs"))
    m.checkpoint_gbs = machine.number(
        "checkpoint_gbs", positive,
        "must be positive: GB/s at which the job writes a checkpoint (omit it when unknown)");

  Table peak(section(root, "peak_tflops", source), "peak_tflops", source, {"fp32", "tf32", "bf16"});
  const std::string rule = "must be positive: TFLOP/s per device";
  m.peak_tflops_fp32 = peak.number("fp32", positive, rule);
  m.peak_tflops_tf32 = peak.number("tf32", positive, rule);
  m.peak_tflops_bf16 = peak.number("bf16", positive, rule);

  const Value* network = section(root, "network", source);
  Table(network, "network", source, {"intra_node", "inter_node"}); // refuses other levels
  for (const char* name : {"intra_node", "inter_node"}) {
    NetworkLevel& level = std::string(name) == "intra_node" ? m.intra : m.inter;
    const std::string full = std::string("network.") + name;
    Table t(section(*network, name, source), full, source, {"bandwidth_gbs", "latency_us"});
    const bool intra = &level == &m.intra;
    level.bandwidth_gbs = t.number("bandwidth_gbs", positive,
                                   std::string("must be positive: GB/s one way ") +
                                       (intra ? "per device" : "per node, shared by its devices"));
    level.latency_us = t.number(
        "latency_us", [](double x) { return x >= 0; }, "must be at least 0: microseconds");
  }
  return m;
}

Machine load_machine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(path + ": cannot open the machine file (does it exist and is it readable?)", true);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_machine(text.str(), path);
}

std::string machine_toml(const Machine& m, const std::string& comment) {
  std::ostringstream out;
  out << std::setprecision(6);
  out << comment;
  std::string name;
  for (const char c : m.name)
    name += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  out << "[machine]\nname = \"" << name << "\"\ndevices_per_node = " << m.devices_per_node
      << "\nmemory_gib = " << m.memory_gib << "\nmemory_gbs = " << m.memory_gbs
      << "\ngemm_efficiency = " << m.gemm_efficiency;
  if (m.checkpoint_gbs > 0)
    out << "\ncheckpoint_gbs = " << m.checkpoint_gbs;
  out << "\n\n[peak_tflops]\nfp32 = " << m.peak_tflops_fp32 << "\ntf32 = " << m.peak_tflops_tf32
      << "\nbf16 = " << m.peak_tflops_bf16
      << "\n\n[network.intra_node]\nbandwidth_gbs = " << m.intra.bandwidth_gbs
      << "\nlatency_us = " << m.intra.latency_us
      << "\n\n[network.inter_node]\nbandwidth_gbs = " << m.inter.bandwidth_gbs
      << "\nlatency_us = " << m.inter.latency_us << "\n";
  return out.str();
}

} // namespace cubelm::io
