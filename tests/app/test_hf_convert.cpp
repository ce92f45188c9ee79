// `cubelm convert` between checkpoints and Hugging Face GPT-2 directories: every cubelm
// tensor lands where GPT2LMHeadModel keeps it (checked element by element against the
// closed-form values it was written with, by index arithmetic of its own), the way back
// gives the same checkpoint, and every input that cannot be converted is a cubelm::Error
// that names the file, the value and the rule.

#include "cubelm/app/hf.hpp"
#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/deck.hpp"
#include "cubelm/io/json.hpp"
#include "cubelm/io/safetensors.hpp"
#include "cubelm/train/checkpointing.hpp"

#include "deck_text.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;
using cubelm::testing::error_of;
namespace fs = std::filesystem;
using Values = std::map<std::string, std::vector<float>>;

using cubelm::testing::TempDir;

namespace {

// V 10, T 6, H 8, 2 heads, 2 layers.
DeckText tiny() {
  return DeckText()
      .set("model.vocab_size", 10)
      .set("model.seq_len", 6)
      .set("model.hidden", 8)
      .set("train.global_batch", 2);
}

// Tensor number t of the model (parameter_table's order), element i: 1000 t + i.
Values closed_form(const ModelConfig& m) {
  Values values;
  int t = 0;
  for (const auto& [name, shape] : cost::parameter_shapes(m)) {
    std::size_t n = 1;
    for (const auto d : shape)
      n *= static_cast<std::size_t>(d);
    std::vector<float>& v = values[name];
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(static_cast<float>(1000 * t + static_cast<int>(i)));
    ++t;
  }
  return values;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::vector<float> read_dataset(const io::CheckpointReader& r, const std::string& name) {
  const std::vector<std::uint64_t> shape = r.shape(name);
  std::vector<float> v(io::Block::whole(shape).size());
  r.read(name, io::Block::whole(shape), v.data());
  return v;
}

// A Hugging Face directory made by export_hf from the closed-form model of `deck`.
void exported(const TempDir& f, const Deck& deck, const std::string& dir) {
  const comm::Communicator comm = comm::Communicator::world();
  train::save_model_tensors(f.path("model.h5"), deck, closed_form(deck.model), comm);
  app::export_hf(f.path("model.h5"), dir, comm);
}

} // namespace

TEST(HfConvert, TensorNamesAndShapesAreGpt2s) {
  const ModelConfig m = tiny().deck("t.toml").model;
  const std::vector<app::HfTensor> all = app::hf_tensors(m);
  ASSERT_EQ(all.size(), 2u + 12u * 2u + 2u);
  EXPECT_EQ(all[0].name, "wte.weight");
  EXPECT_EQ(all[0].shape, (std::vector<std::uint64_t>{10, 8}));
  EXPECT_EQ(all[1].name, "wpe.weight");
  EXPECT_EQ(all[1].shape, (std::vector<std::uint64_t>{6, 8}));
  EXPECT_EQ(all[2 + 12 + 2].name, "h.1.attn.c_attn.weight");
  EXPECT_EQ(all[2 + 12 + 2].shape, (std::vector<std::uint64_t>{8, 24}));
  EXPECT_EQ(all[2 + 12 + 2].parts,
            (std::vector<std::string>{"layers/1/attn/wq", "layers/1/attn/wk", "layers/1/attn/wv"}));
  EXPECT_EQ(all[2 + 10].name, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(all[2 + 10].shape, (std::vector<std::uint64_t>{32, 8}));
  EXPECT_EQ(all.back().name, "ln_f.bias");
}

TEST(HfConvert, ExportPlacesEveryTensorAndImportGivesItBack) {
  const TempDir f;
  const Deck deck = tiny().deck("t.toml");
  const ModelConfig& m = deck.model;
  const Values values = closed_form(m);
  exported(f, deck, f.path("hf"));

  const io::SafetensorsReader st(f.path("hf/model.safetensors"));
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_EQ(st.find("lm_head.weight"), nullptr);
  EXPECT_EQ(st.tensors().size(), 2u + 12u * 2u + 2u);
  const std::size_t h = 8;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    const std::string c = "layers/" + std::to_string(l) + "/";
    const std::vector<float> qkv = st.read_floats(p + "attn.c_attn.weight");
    const std::vector<float> qkv_bias = st.read_floats(p + "attn.c_attn.bias");
    ASSERT_EQ(qkv.size(), h * 3 * h);
    for (std::size_t part = 0; part < 3; ++part) {
      const char* w = part == 0 ? "attn/wq" : part == 1 ? "attn/wk" : "attn/wv";
      const char* b = part == 0 ? "attn/bq" : part == 1 ? "attn/bk" : "attn/bv";
      for (std::size_t i = 0; i < h; ++i) {
        for (std::size_t j = 0; j < h; ++j)
          ASSERT_EQ(qkv[i * 3 * h + part * h + j], values.at(c + w)[i * h + j])
              << p << " c_attn.weight[" << i << ", " << part * h + j << "]";
        ASSERT_EQ(qkv_bias[part * h + i], values.at(c + b)[i]);
      }
    }
    EXPECT_EQ(st.read_floats(p + "ln_1.weight"), values.at(c + "ln1/gamma"));
    EXPECT_EQ(st.read_floats(p + "ln_1.bias"), values.at(c + "ln1/beta"));
    EXPECT_EQ(st.read_floats(p + "ln_2.weight"), values.at(c + "ln2/gamma"));
    EXPECT_EQ(st.read_floats(p + "ln_2.bias"), values.at(c + "ln2/beta"));
    EXPECT_EQ(st.read_floats(p + "attn.c_proj.weight"), values.at(c + "attn/wo"));
    EXPECT_EQ(st.read_floats(p + "attn.c_proj.bias"), values.at(c + "attn/bo"));
    EXPECT_EQ(st.read_floats(p + "mlp.c_fc.weight"), values.at(c + "mlp/w1"));
    EXPECT_EQ(st.read_floats(p + "mlp.c_fc.bias"), values.at(c + "mlp/b1"));
    EXPECT_EQ(st.read_floats(p + "mlp.c_proj.weight"), values.at(c + "mlp/w2"));
    EXPECT_EQ(st.read_floats(p + "mlp.c_proj.bias"), values.at(c + "mlp/b2"));
  }
  EXPECT_EQ(st.read_floats("wte.weight"), values.at("wte"));
  EXPECT_EQ(st.read_floats("wpe.weight"), values.at("wpe"));
  EXPECT_EQ(st.read_floats("ln_f.weight"), values.at("ln_f/gamma"));
  EXPECT_EQ(st.read_floats("ln_f.bias"), values.at("ln_f/beta"));

  std::ifstream in(f.path("hf/config.json"));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const io::Json config = io::parse_json(text, "config.json");
  EXPECT_EQ(config.find("model_type")->text(), "gpt2");
  EXPECT_EQ(config.find("n_embd")->unsigned_integer(), std::optional<std::uint64_t>(8));
  EXPECT_EQ(config.find("n_positions")->unsigned_integer(), std::optional<std::uint64_t>(6));
  EXPECT_EQ(config.find("bos_token_id")->unsigned_integer(), std::optional<std::uint64_t>(9))
      << "a vocabulary without GPT-2's 50256: the last token";
  EXPECT_TRUE(config.find("n_inner")->is_null());
  EXPECT_EQ(config.find("layer_norm_epsilon")->number(), 1e-5);
  const ModelConfig read = app::read_hf_config(f.path("hf/config.json"));
  EXPECT_EQ(read.vocab_size, 10);
  EXPECT_EQ(read.seq_len, 6);
  EXPECT_EQ(read.hidden, 8);
  EXPECT_EQ(read.heads, 2);
  EXPECT_EQ(read.layers, 2);

  const comm::Communicator comm = comm::Communicator::world();
  app::import_hf(f.path("hf"), f.path("back.h5"), comm);
  const io::CheckpointReader r(f.path("back.h5"), comm);
  for (const auto& [name, v] : values) {
    EXPECT_EQ(read_dataset(r, "/model/" + name), v) << name;
    EXPECT_EQ(read_dataset(r, "/optimizer/m/" + name), std::vector<float>(v.size(), 0.0f));
    EXPECT_EQ(read_dataset(r, "/optimizer/v/" + name), std::vector<float>(v.size(), 0.0f));
  }
  EXPECT_EQ(r.int_attribute("/", "step"), 0);
  EXPECT_EQ(r.int_attribute("/optimizer", "step"), 0);
  const Deck stored = io::read_deck(r.string_attribute("/", "deck")).deck;
  EXPECT_EQ(stored.model.vocab_size, 10);
  EXPECT_EQ(stored.model.seq_len, 6);
  EXPECT_EQ(stored.model.hidden, 8);
  EXPECT_EQ(stored.model.heads, 2);
  EXPECT_EQ(stored.model.layers, 2);
}

TEST(HfConvert, RefusesConfigsItCannotCompute) {
  const TempDir f;
  const std::string path = f.path("config.json");
  const std::string good = R"("n_positions": 6, "n_embd": 8, "n_layer": 2, "n_head": 2)";
  const auto error = [&](const std::string& text) {
    write_text(path, text);
    const std::string m = error_of([&] { app::read_hf_config(path); }, true);
    EXPECT_HAS(m, path);
    return m;
  };
  EXPECT_HAS(error(R"({"model_type": "llama", "vocab_size": 10, )" + good + "}"),
             "model_type = \"llama\": cubelm converts GPT-2 models only");
  EXPECT_HAS(error(R"({"vocab_size": 10, )" + good + "}"), "no \"model_type\"");
  EXPECT_HAS(error(R"({"model_type": "gpt2", )" + good + "}"),
             "no \"vocab_size\": a GPT-2 config.json gives vocab_size, n_positions");
  EXPECT_HAS(error(R"({"model_type": "gpt2", "vocab_size": "10", )" + good + "}"),
             "vocab_size = \"10\": must be a positive integer");
  EXPECT_HAS(error(R"({"model_type": "gpt2", "vocab_size": 0, )" + good + "}"),
             "vocab_size = 0: must be a positive integer");
  const std::string base = R"({"model_type": "gpt2", "vocab_size": 10, )" + good;
  EXPECT_HAS(error(R"({"model_type": "gpt2", "vocab_size": 10, "n_positions": 6, "n_embd": 8,
                      "n_layer": 2, "n_head": 3})"),
             "n_embd = 8 is not divisible by n_head = 3");
  EXPECT_HAS(error(base + R"(, "activation_function": "relu"})"),
             "activation_function = \"relu\": cubelm's GPT-2 computes GELU's tanh approximation");
  EXPECT_HAS(error(base + R"(, "layer_norm_epsilon": 1e-6})"),
             "layer_norm_epsilon = 1e-6: cubelm's LayerNorm uses 1e-05");
  EXPECT_HAS(error(base + R"(, "n_inner": 16})"), "n_inner = 16: cubelm's MLP has 4 n_embd = 32");
  EXPECT_HAS(error(base + R"(, "tie_word_embeddings": false})"),
             "tie_word_embeddings = false: cubelm's head is tied to wte");
  EXPECT_HAS(error(base + R"(, "scale_attn_by_inverse_layer_idx": true})"),
             "scale_attn_by_inverse_layer_idx = true");
  EXPECT_HAS(error(base + R"(, "scale_attn_weights": 1})"),
             "scale_attn_weights = 1: must be true or false");
  EXPECT_HAS(error(base + ","), "line 1, column");
  EXPECT_HAS(error("[1, 2]"), "holds an array: config.json must be a JSON object");
  EXPECT_HAS(error_of([&] { app::read_hf_config(f.path("none.json")); }, true),
             "none.json: no such file");
  // What GPT2Config allows and cubelm computes alike is accepted; dropout is ignored.
  write_text(path, base + R"(, "n_inner": null, "n_ctx": 1024, "attn_pdrop": 0.1,
      "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-05,
      "tie_word_embeddings": true, "reorder_and_upcast_attn": true})");
  EXPECT_EQ(app::read_hf_config(path).hidden, 8);
}

TEST(HfConvert, RefusesWeightsThatDoNotFitTheConfig) {
  const TempDir f;
  const Deck deck = tiny().deck("t.toml");
  const std::string dir = f.path("hf");
  exported(f, deck, dir);
  const std::string weights = dir + "/model.safetensors";
  // The exported tensors, to write again with one change.
  std::map<std::string, std::pair<std::vector<std::uint64_t>, std::vector<float>>> tensors;
  {
    const io::SafetensorsReader st(weights);
    for (const io::SafetensorsEntry& e : st.tensors())
      tensors[e.name] = {e.shape, st.read_floats(e.name)};
  }
  const auto rewrite = [&](const std::function<void(decltype(tensors)&)>& change) {
    auto copy = tensors;
    change(copy);
    std::vector<io::SafetensorsTensor> list;
    for (const auto& [name, t] : copy)
      list.push_back({name, t.first, t.second.data()});
    io::write_safetensors(weights, list);
  };
  const comm::Communicator comm = comm::Communicator::world();
  const auto error = [&] {
    const std::string m = error_of([&] { app::import_hf(dir, f.path("out.h5"), comm); }, true);
    EXPECT_FALSE(fs::exists(f.path("out.h5")));
    return m;
  };
  rewrite([](auto& t) { t.erase("h.1.mlp.c_fc.bias"); });
  EXPECT_HAS(error(), weights + ": has no tensor \"h.1.mlp.c_fc.bias\" (nor "
                                "\"transformer.h.1.mlp.c_fc.bias\")");
  rewrite([](auto& t) {
    t["wpe.weight"].first = {7, 8};
    t["wpe.weight"].second.resize(56);
  });
  EXPECT_HAS(error(), "tensor \"wpe.weight\" has shape [7, 8], config.json (vocab_size = 10, "
                      "n_positions = 6, n_embd = 8) needs [6, 8]");
  rewrite([](auto& t) { t["h.2.ln_1.weight"] = t["h.1.ln_1.weight"]; });
  EXPECT_HAS(error(), "holds 1 tensor that the GPT-2 of config.json (n_layer = 2) does not have: "
                      "\"h.2.ln_1.weight\"");
  rewrite([](auto& t) {
    t["lm_head.weight"] = t["wte.weight"];
    t["lm_head.weight"].second[3] += 1.0f;
  });
  EXPECT_HAS(error(), "lm_head.weight differs from wte.weight");
  rewrite([](auto& t) { t["transformer.wte.weight"] = t["wte.weight"]; });
  EXPECT_HAS(error(), "holds both \"transformer.wte.weight\" and \"wte.weight\"");
  // A damaged file: the reader's own message, naming the file.
  {
    std::fstream io(weights, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(7); // the header length's top byte: far beyond the file
    io.put(static_cast<char>(0x01));
  }
  EXPECT_HAS(error(), weights + ": header length");
  fs::remove(weights);
  EXPECT_HAS(error(), weights + ": no such file: cubelm reads the weights from model.safetensors");
  write_text(dir + "/model.safetensors.index.json", "{}");
  EXPECT_HAS(error(), "split over several safetensors files");
  EXPECT_HAS(error_of([&] { app::import_hf(f.path("nowhere"), f.path("out.h5"), comm); }, true),
             "nowhere: no such directory");

  // The prefixed names of GPT2LMHeadModel's state dict, the old mask buffers and a tied
  // lm_head are read.
  fs::remove(dir + "/model.safetensors.index.json");
  rewrite([](auto& t) {
    auto renamed = decltype(tensors){};
    for (auto& [name, v] : t)
      renamed["transformer." + name] = v;
    renamed["lm_head.weight"] = t["wte.weight"];
    renamed["transformer.h.0.attn.bias"] = {{1, 1, 6, 6}, std::vector<float>(36, 1.0f)};
    renamed["transformer.h.1.attn.masked_bias"] = {{}, {-1e4f}};
    t = renamed;
  });
  app::import_hf(dir, f.path("out.h5"), comm);
  const io::CheckpointReader r(f.path("out.h5"), comm);
  EXPECT_EQ(read_dataset(r, "/model/layers/1/attn/wk"),
            closed_form(deck.model).at("layers/1/attn/wk"));
}

TEST(HfConvert, RefusesModelsGpt2CannotHold) {
  const TempDir f;
  const comm::Communicator comm = comm::Communicator::world();
  const Deck moe = tiny().set("model.experts", 4).set("model.top_k", 2).deck("moe.toml");
  train::save_model_tensors(f.path("moe.h5"), moe, closed_form(moe.model), comm);
  std::string m = error_of([&] { app::export_hf(f.path("moe.h5"), f.path("hf"), comm); }, true);
  EXPECT_HAS(m, "checkpoint " + f.path("moe.h5") +
                    ": model.experts = 4 with moe_every = 1 gives "
                    "2 mixture-of-experts layers");
  // One expert: the dense MLP, a GPT-2 after all.
  const Deck dense = tiny().set("model.experts", 1).set("model.top_k", 1).deck("d.toml");
  train::save_model_tensors(f.path("dense.h5"), dense, closed_form(dense.model), comm);
  app::export_hf(f.path("dense.h5"), f.path("hf"), comm);
  EXPECT_TRUE(fs::exists(f.path("hf/model.safetensors")));
  // Not a cubelm checkpoint.
  m = error_of([&] { app::export_hf(f.path("hf/model.safetensors"), f.path("x"), comm); }, true);
  EXPECT_HAS(m, f.path("hf/model.safetensors"));
}
