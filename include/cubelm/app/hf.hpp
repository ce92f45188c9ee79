#pragma once
/// \file
/// \brief `cubelm convert`: cubelm checkpoints to and from Hugging Face GPT-2 model
/// directories (`model.safetensors` and `config.json`, as `transformers`'
/// GPT2LMHeadModel loads them; docs/training.md, "Hugging Face GPT-2").
///
/// The two models are the same function: learned positions, pre-LayerNorm blocks with
/// eps 1e-5, GELU's tanh approximation ("gelu_new"), attention scaled by 1/sqrt(head
/// size), heads as contiguous column blocks, the head tied to wte. Hugging Face's
/// Conv1D weights are [in, out] as cubelm's are; only the names differ, and the
/// attention's q, k and v, which cubelm stores as three tensors, are one c_attn tensor
/// [H, 3H] there (q | k | v along the columns).

#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/core/environment.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::app {

/// \brief A tensor of the Hugging Face GPT-2 layout: its name (without the
/// "transformer." prefix), its shape, and the cubelm tensors (names below /model) that
/// it concatenates along its last dimension (one for all but c_attn).
struct HfTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<std::string> parts;
};

/// \brief Every tensor of the Hugging Face model of `m`, in the order they are written:
/// wte, wpe, h.<l>.*, ln_f (no lm_head.weight: it is tied to wte).
std::vector<HfTensor> hf_tensors(const ModelConfig& m);

/// \brief The config.json of `m`: the fields GPT2Config documents, with cubelm's fixed
/// choices (gelu_new, layer_norm_epsilon 1e-5, no dropout, tied embeddings, float32).
/// bos_token_id and eos_token_id are 50256 (GPT-2's <|endoftext|>) when the vocabulary
/// holds it, else the last token.
std::string hf_config_json(const ModelConfig& m);

/// \brief The model a config.json describes. Errors (cubelm::Error naming the file, the
/// field, the value and the rule): model_type other than "gpt2"; vocab_size, n_positions,
/// n_embd, n_layer or n_head missing or not a positive integer; n_embd not divisible by
/// n_head; and a field that asks for what cubelm's GPT-2 does not compute (n_inner other
/// than null or 4 n_embd, activation_function other than gelu_new or gelu_pytorch_tanh,
/// layer_norm_epsilon other than 1e-5, untied embeddings, unscaled attention, attention
/// scaled by the layer index, cross-attention). Dropout fields are ignored: cubelm trains
/// without dropout.
ModelConfig read_hf_config(const std::string& path);

/// \brief The deck text stored in a checkpoint converted from the Hugging Face model in
/// `dir`: its [model] keys and a comment saying where it came from.
std::string hf_deck_text(const ModelConfig& m, const std::string& dir);

/// \brief Collective over `comm` (run on one process): writes `dir`/model.safetensors
/// (float32) and `dir`/config.json from the model of a cubelm checkpoint. A model
/// GPT-2 cannot express (MoE layers) is refused, as is a file that is no cubelm
/// checkpoint. Returns the line `cubelm convert` prints.
std::string export_hf(const std::string& checkpoint, const std::string& dir,
                      const comm::Communicator& comm);

/// \brief Collective over `comm` (run on one process): writes a step-0 cubelm checkpoint
/// (zero AdamW moments, the deck of hf_deck_text) from the Hugging Face GPT-2 in `dir`.
/// Tensor names may carry the "transformer." prefix; the attention masks of older files
/// (h.<l>.attn.bias, h.<l>.attn.masked_bias) are skipped; an lm_head.weight must equal
/// wte. F32, F16 and BF16 tensors are read (as float32). A missing tensor, a tensor of
/// another shape than config.json implies, or one GPT2LMHeadModel does not have is a
/// cubelm::Error naming the file and the tensor. Returns the line `cubelm convert` prints.
std::string import_hf(const std::string& dir, const std::string& checkpoint,
                      const comm::Communicator& comm);

/// \brief `cubelm convert --to hf CKPT -o DIR` (`to` = "hf") or `cubelm convert --from hf
/// DIR -o CKPT` (`from` = "hf"). Runs on one process.
int run_convert(const std::string& to, const std::string& from, const std::string& input,
                const std::string& output, const Environment& env);

} // namespace cubelm::app
