#include "cubelm/app/hf.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/core/version.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/deck.hpp"
#include "cubelm/io/json.hpp"
#include "cubelm/io/safetensors.hpp"
#include "cubelm/train/checkpointing.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace cubelm::app {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "transformer.";
// GPT-2's <|endoftext|>, its bos and eos token.
constexpr int kEndOfText = 50256;

std::uint64_t elements(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (const std::uint64_t d : shape)
    n *= d;
  return n;
}

// Errors of one process that every rank of a one-process job sees alike.
[[noreturn]] void fail(const std::string& message) {
  throw Error(message, true);
}

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(path + ": no such file (" + what + ")");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The positive integer field `key` of config.json.
int positive_field(const io::Json& config, const std::string& path, const char* key) {
  const io::Json* v = config.find(key);
  if (v == nullptr)
    fail(path + ": no \"" + key +
         "\": a GPT-2 config.json gives vocab_size, n_positions, n_embd, n_layer and n_head");
  const auto n = v->unsigned_integer();
  if (!n || *n == 0 || *n > 0x7fffffff)
    fail(path + ": " + key + " = " + v->describe() + ": must be a positive integer");
  return static_cast<int>(*n);
}

// A boolean field that must hold `expected` when present (GPT2Config's default otherwise).
void boolean_field(const io::Json& config, const std::string& path, const char* key, bool expected,
                   const std::string& rule) {
  const io::Json* v = config.find(key);
  if (v == nullptr)
    return;
  if (!v->is_boolean())
    fail(path + ": " + key + " = " + v->describe() + ": must be true or false");
  if (v->boolean() != expected)
    fail(path + ": " + key + " = " + v->describe() + ": " + rule);
}

// A Hugging Face tensor concatenates its parts along its last dimension: each part is
// rows x (columns / parts), row-major.
void scatter(const HfTensor& t, const std::vector<float>& whole,
             std::map<std::string, std::vector<float>>& out) {
  const std::uint64_t columns = t.shape.back();
  const std::uint64_t rows = elements(t.shape) / columns;
  const std::uint64_t width = columns / t.parts.size();
  for (std::size_t p = 0; p < t.parts.size(); ++p) {
    std::vector<float>& part = out[t.parts[p]];
    part.resize(static_cast<std::size_t>(rows * width));
    for (std::uint64_t r = 0; r < rows; ++r)
      for (std::uint64_t c = 0; c < width; ++c)
        part[r * width + c] = whole[r * columns + p * width + c];
  }
}

std::vector<float> gather(const HfTensor& t, const std::map<std::string, std::vector<float>>& in) {
  const std::uint64_t columns = t.shape.back();
  const std::uint64_t rows = elements(t.shape) / columns;
  const std::uint64_t width = columns / t.parts.size();
  std::vector<float> whole(static_cast<std::size_t>(rows * columns));
  for (std::size_t p = 0; p < t.parts.size(); ++p) {
    const std::vector<float>& part = in.at(t.parts[p]);
    for (std::uint64_t r = 0; r < rows; ++r)
      for (std::uint64_t c = 0; c < width; ++c)
        whole[r * columns + p * width + c] = part[r * width + c];
  }
  return whole;
}

// h.<l>.attn.bias and h.<l>.attn.masked_bias: the causal mask and its fill value, buffers
// that older versions of transformers saved with the weights.
bool is_mask_buffer(const std::string& name) {
  const auto ends_with = [&](const std::string& tail) {
    return name.size() > tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return name.rfind("h.", 0) == 0 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"));
}

void one_process(const comm::Communicator& comm) {
  if (comm.size() != 1)
    fail("cubelm convert runs on one process (this job has " + std::to_string(comm.size()) +
         "): start it without mpiexec");
}

} // namespace

std::vector<HfTensor> hf_tensors(const ModelConfig& m) {
  const std::uint64_t h = static_cast<std::uint64_t>(m.hidden);
  const std::uint64_t v = static_cast<std::uint64_t>(m.vocab_size);
  const std::uint64_t t = static_cast<std::uint64_t>(m.seq_len);
  std::vector<HfTensor> all = {{"wte.weight", {v, h}, {"wte"}}, {"wpe.weight", {t, h}, {"wpe"}}};
  for (int l = 0; l < m.layers; ++l) {
    const cost::LayerParams n = cost::layer_params(l);
    const std::string p = "h." + std::to_string(l) + ".";
    all.push_back({p + "ln_1.weight", {h}, {n.ln1 + "/gamma"}});
    all.push_back({p + "ln_1.bias", {h}, {n.ln1 + "/beta"}});
    all.push_back({p + "attn.c_attn.weight", {h, 3 * h}, n.qkv});
    all.push_back({p + "attn.c_attn.bias", {3 * h}, n.qkv_bias});
    all.push_back({p + "attn.c_proj.weight", {h, h}, {n.wo}});
    all.push_back({p + "attn.c_proj.bias", {h}, {n.bo}});
    all.push_back({p + "ln_2.weight", {h}, {n.ln2 + "/gamma"}});
    all.push_back({p + "ln_2.bias", {h}, {n.ln2 + "/beta"}});
    all.push_back({p + "mlp.c_fc.weight", {h, 4 * h}, {n.w1}});
    all.push_back({p + "mlp.c_fc.bias", {4 * h}, {n.b1}});
    all.push_back({p + "mlp.c_proj.weight", {4 * h, h}, {n.w2}});
    all.push_back({p + "mlp.c_proj.bias", {h}, {n.b2}});
  }
  all.push_back({"ln_f.weight", {h}, {"ln_f/gamma"}});
  all.push_back({"ln_f.bias", {h}, {"ln_f/beta"}});
  return all;
}

std::string hf_config_json(const ModelConfig& m) {
  const int special = m.vocab_size > kEndOfText ? kEndOfText : m.vocab_size - 1;
  std::ostringstream out;
  out << "{\n"
      << "  \"activation_function\": \"gelu_new\",\n"
      << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
      << "  \"attn_pdrop\": 0.0,\n"
      << "  \"bos_token_id\": " << special << ",\n"
      << "  \"embd_pdrop\": 0.0,\n"
      << "  \"eos_token_id\": " << special << ",\n"
      << "  \"initializer_range\": 0.02,\n"
      << "  \"layer_norm_epsilon\": 1e-05,\n"
      << "  \"model_type\": \"gpt2\",\n"
      << "  \"n_ctx\": " << m.seq_len << ",\n"
      << "  \"n_embd\": " << m.hidden << ",\n"
      << "  \"n_head\": " << m.heads << ",\n"
      << "  \"n_inner\": null,\n"
      << "  \"n_layer\": " << m.layers << ",\n"
      << "  \"n_positions\": " << m.seq_len << ",\n"
      << "  \"reorder_and_upcast_attn\": false,\n"
      << "  \"resid_pdrop\": 0.0,\n"
      << "  \"scale_attn_by_inverse_layer_idx\": false,\n"
      << "  \"scale_attn_weights\": true,\n"
      << "  \"summary_activation\": null,\n"
      << "  \"summary_first_dropout\": 0.1,\n"
      << "  \"summary_proj_to_labels\": true,\n"
      << "  \"summary_type\": \"cls_index\",\n"
      << "  \"summary_use_proj\": true,\n"
      << "  \"tie_word_embeddings\": true,\n"
      << "  \"torch_dtype\": \"float32\",\n"
      << "  \"use_cache\": true,\n"
      << "  \"vocab_size\": " << m.vocab_size << "\n"
      << "}\n";
  return out.str();
}

ModelConfig read_hf_config(const std::string& path) {
  const std::string text =
      read_text(path, "a Hugging Face model directory holds config.json and model.safetensors");
  io::Json config;
  try {
    config = io::parse_json(text, path);
  } catch (const Error& e) {
    fail(e.what());
  }
  if (!config.is_object())
    fail(path + ": holds " + config.describe() + ": config.json must be a JSON object");
  const io::Json* type = config.find("model_type");
  if (type == nullptr)
    fail(path + ": no \"model_type\": cubelm converts GPT-2 models (model_type \"gpt2\")");
  if (!type->is_string() || type->text() != "gpt2")
    fail(path + ": model_type = " + type->describe() +
         ": cubelm converts GPT-2 models only (model_type \"gpt2\")");
  ModelConfig m;
  m.vocab_size = positive_field(config, path, "vocab_size");
  m.seq_len = positive_field(config, path, "n_positions");
  m.hidden = positive_field(config, path, "n_embd");
  m.layers = positive_field(config, path, "n_layer");
  m.heads = positive_field(config, path, "n_head");
  if (m.hidden % m.heads != 0)
    fail(path + ": n_embd = " + std::to_string(m.hidden) + " is not divisible by n_head = " +
         std::to_string(m.heads) + ": every head has n_embd / n_head features");
  if (const io::Json* inner = config.find("n_inner"); inner != nullptr && !inner->is_null()) {
    const auto n = inner->unsigned_integer();
    if (!n || *n != 4 * static_cast<std::uint64_t>(m.hidden))
      fail(path + ": n_inner = " + inner->describe() +
           ": cubelm's MLP has 4 n_embd = " + std::to_string(4 * m.hidden) +
           " hidden features (n_inner null or " + std::to_string(4 * m.hidden) + ")");
  }
  if (const io::Json* act = config.find("activation_function"); act != nullptr) {
    if (!act->is_string() || (act->text() != "gelu_new" && act->text() != "gelu_pytorch_tanh"))
      fail(path + ": activation_function = " + act->describe() +
           ": cubelm's GPT-2 computes GELU's tanh approximation (\"gelu_new\" or "
           "\"gelu_pytorch_tanh\")");
  }
  if (const io::Json* eps = config.find("layer_norm_epsilon"); eps != nullptr) {
    if (!eps->is_number() || eps->number() != 1e-5)
      fail(path + ": layer_norm_epsilon = " + eps->describe() +
           ": cubelm's LayerNorm uses 1e-05 (GPT-2's)");
  }
  boolean_field(config, path, "tie_word_embeddings", true,
                "cubelm's head is tied to wte (tie_word_embeddings true)");
  boolean_field(config, path, "scale_attn_weights", true,
                "cubelm scales attention scores by 1/sqrt(n_embd / n_head) "
                "(scale_attn_weights true)");
  boolean_field(config, path, "scale_attn_by_inverse_layer_idx", false,
                "cubelm does not scale attention by the layer index "
                "(scale_attn_by_inverse_layer_idx false)");
  boolean_field(config, path, "add_cross_attention", false,
                "cubelm's GPT-2 has no cross-attention (add_cross_attention false)");
  return m;
}

std::string hf_deck_text(const ModelConfig& m, const std::string& dir) {
  std::string where = dir;
  for (char& c : where)
    if (c == '\n' || c == '\r')
      c = ' ';
  std::ostringstream out;
  out << "# The model of the Hugging Face GPT-2 in " << where << " (config.json),\n"
      << "# converted by `cubelm convert --from hf`. A run starts from these weights with a deck\n"
      << "# of its own: these [model] keys, checkpoint.resume = the file and\n"
      << "# checkpoint.allow_other_run = true.\n"
      << "[model]\n"
      << "vocab_size = " << m.vocab_size << "\n"
      << "seq_len = " << m.seq_len << "\n"
      << "hidden = " << m.hidden << "\n"
      << "heads = " << m.heads << "\n"
      << "layers = " << m.layers << "\n";
  return out.str();
}

std::string export_hf(const std::string& checkpoint, const std::string& dir,
                      const comm::Communicator& comm) {
  one_process(comm);
  const io::CheckpointReader r(checkpoint, comm);
  const std::int64_t version = r.int_attribute("/", "version");
  if (version != train::kCheckpointVersion)
    fail("checkpoint " + checkpoint + ": schema version " + std::to_string(version) +
         " is not supported (this cubelm reads version " +
         std::to_string(train::kCheckpointVersion) + ")");
  // The deck as a file (its keys' own rules): the model is all that is needed, and the
  // layout that wrote the checkpoint need not be valid here.
  ModelConfig m;
  try {
    m = io::read_deck(r.string_attribute("/", "deck"), checkpoint + " (its deck)").deck.model;
  } catch (const Error& e) {
    fail(e.what());
  }
  if (cost::moe_layer_count(m) > 0)
    fail("checkpoint " + checkpoint + ": model.experts = " + std::to_string(m.experts) +
         " with moe_every = " + std::to_string(m.moe_every) + " gives " +
         std::to_string(cost::moe_layer_count(m)) +
         " mixture-of-experts layers: Hugging Face GPT-2 (GPT2LMHeadModel) has one dense MLP "
         "per layer and cannot hold them");
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, shape64] : cost::parameter_shapes(m)) {
    const std::vector<std::uint64_t> shape(shape64.begin(), shape64.end());
    r.expect_shape("/model/" + name, shape);
    std::vector<float>& v = values[name];
    v.resize(static_cast<std::size_t>(elements(shape)));
    r.read("/model/" + name, io::Block::whole(shape), v.data());
  }
  const std::int64_t step = r.int_attribute("/", "step");

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec))
    fail(dir + ": cannot create the directory for the Hugging Face model");
  const std::vector<HfTensor> layout = hf_tensors(m);
  std::vector<std::vector<float>> whole;
  whole.reserve(layout.size());
  std::vector<io::SafetensorsTensor> tensors;
  for (const HfTensor& t : layout) {
    whole.push_back(gather(t, values));
    for (const std::string& part : t.parts)
      values.erase(part); // each cubelm tensor is in one Hugging Face tensor: free it
    tensors.push_back({t.name, t.shape, whole.back().data()});
  }
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  const std::string config = (fs::path(dir) / "config.json").string();
  try {
    io::write_safetensors(weights, tensors,
                          {{"format", "pt"},
                           {"producer", std::string("cubelm ") + CUBELM_VERSION_STRING},
                           {"step", std::to_string(step)}});
  } catch (const Error& e) {
    fail(e.what());
  }
  {
    std::ofstream out(config, std::ios::binary | std::ios::trunc);
    out << hf_config_json(m);
    out.flush();
    if (!out)
      fail(config + ": cannot write the file");
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "%s: Hugging Face GPT-2 (GPT2LMHeadModel) of %s (step %lld): model.safetensors "
                "(%.3g M parameters, float32) and config.json",
                dir.c_str(), checkpoint.c_str(), static_cast<long long>(step),
                cost::parameter_count(m) / 1e6);
  return line;
}

std::string import_hf(const std::string& dir, const std::string& checkpoint,
                      const comm::Communicator& comm) {
  one_process(comm);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(dir + ": no such directory (a Hugging Face model directory holds config.json and "
               "model.safetensors)");
  const ModelConfig m = read_hf_config(config_path);
  if (!fs::exists(weights, ec)) {
    const bool sharded = fs::exists(fs::path(dir) / "model.safetensors.index.json", ec);
    fail(weights + ": no such file: " +
         (sharded ? std::string("the model is split over several safetensors files "
                                "(model.safetensors.index.json), which cubelm does not read")
                  : std::string("cubelm reads the weights from model.safetensors")));
  }
  std::map<std::string, std::vector<float>> values;
  try {
    const io::SafetensorsReader st(weights);
    // The stored name of each tensor without the "transformer." prefix.
    std::map<std::string, std::string> stored;
    for (const io::SafetensorsEntry& e : st.tensors()) {
      const bool prefixed = e.name.rfind(kPrefix, 0) == 0;
      const std::string name = prefixed ? e.name.substr(std::string(kPrefix).size()) : e.name;
      if (!stored.emplace(name, e.name).second)
        fail(weights + ": holds both \"" + stored[name] + "\" and \"" + e.name +
             "\": one of them only");
    }
    const auto shape_of = [&](const std::string& name) { return st.find(stored.at(name))->shape; };
    for (const HfTensor& t : hf_tensors(m)) {
      const auto it = stored.find(t.name);
      if (it == stored.end())
        fail(weights + ": has no tensor \"" + t.name + "\" (nor \"" + kPrefix + t.name +
             "\"), which the GPT-2 of config.json (n_layer = " + std::to_string(m.layers) +
             ") has");
      if (shape_of(t.name) != t.shape)
        fail(weights + ": tensor \"" + it->second + "\" has shape " +
             io::shape_text(shape_of(t.name)) + ", config.json (vocab_size = " +
             std::to_string(m.vocab_size) + ", n_positions = " + std::to_string(m.seq_len) +
             ", n_embd = " + std::to_string(m.hidden) + ") needs " + io::shape_text(t.shape));
      scatter(t, st.read_floats(it->second), values);
      stored.erase(it);
    }
    if (const auto head = stored.find("lm_head.weight"); head != stored.end()) {
      if (st.read_floats(head->second) != values.at("wte"))
        fail(weights + ": lm_head.weight differs from wte.weight: cubelm's head is tied to "
                       "the token embedding and cannot hold a head of its own");
      stored.erase(head);
    }
    std::string unknown;
    int count = 0;
    for (const auto& [name, original] : stored) {
      if (is_mask_buffer(name))
        continue;
      if (++count <= 5)
        unknown += std::string(count > 1 ? ", " : "") + "\"" + original + "\"";
    }
    if (count > 0)
      fail(weights + ": holds " + std::to_string(count) + " tensor" + (count > 1 ? "s" : "") +
           " that the GPT-2 of config.json (n_layer = " + std::to_string(m.layers) +
           ") does not have: " + unknown + (count > 5 ? ", ..." : ""));
  } catch (const Error& e) {
    if (!e.collective())
      fail(e.what());
    throw;
  }
  const std::string deck_text = hf_deck_text(m, dir);
  Deck deck;
  try {
    deck = cost::parse_deck(deck_text, config_path + " (as a deck)");
  } catch (const Error& e) {
    fail(e.what());
  }
  train::save_model_tensors(checkpoint, deck, values, comm);
  char line[512];
  std::snprintf(line, sizeof(line),
                "%s: step-0 checkpoint of the Hugging Face GPT-2 in %s (%.3g M parameters); "
                "start a run from it with checkpoint.resume = \"%s\" and "
                "checkpoint.allow_other_run = true",
                checkpoint.c_str(), dir.c_str(), cost::parameter_count(m) / 1e6,
                checkpoint.c_str());
  return line;
}

int run_convert(const std::string& to, const std::string& from, const std::string& input,
                const std::string& output, const Environment& env) {
  const comm::Communicator world = comm::Communicator::world();
  if (to.empty() == from.empty())
    fail("cubelm convert needs one of --to hf (a checkpoint to a Hugging Face directory) and "
         "--from hf (a Hugging Face directory to a checkpoint)");
  const std::string line =
      !to.empty() ? export_hf(input, output, world) : import_hf(input, output, world);
  if (env.world_rank() == 0)
    std::printf("%s\n", line.c_str());
  return 0;
}

} // namespace cubelm::app
