#!/usr/bin/env bash
# Hugging Face GPT-2 interop (docs/training.md, "Hugging Face GPT-2"), against files and
# arithmetic of its own:
#
#   hf_convert.sh WORKDIR CUBELM MPIEXEC [MPIEXEC ARGS...] --
#
# Cases, in order (each names itself on failure):
#   reference   Python (json and numpy only) writes a random GPT-2 as Hugging Face does
#               (config.json with dropout and n_ctx; model.safetensors with the
#               "transformer." prefix, the old attention-mask buffers, a tied lm_head,
#               wpe in F16 and the LayerNorm biases in BF16, the data in another order
#               than the header); `cubelm convert --from hf` reads it, and the loss of the
#               first batch of an llm.c file (sequential sampler) that `cubelm train`
#               reports from it equals the loss numpy computes in float64 from
#               model.safetensors and config.json with its own safetensors reader, within
#               1e-5 relative
#   logits      the logits `cubelm generate --logits` writes for a prompt and 6 greedy tokens
#               equal numpy's within 1e-5 of the largest, and the tokens are numpy's argmax
#   export      `convert --to hf` of that checkpoint: every tensor equals the input's as
#               float32, bit for bit; the names are the published gpt2's (no prefix, no
#               lm_head, no masks), all F32, the header padded to 8 bytes and the data
#               contiguous; config.json holds GPT2Config's fields with cubelm's values
#   tp-train    the converted model trains 3 steps on 2 ranks of 1d tensor parallelism;
#               its first loss equals numpy's within 1e-5
#   tp-export   the checkpoint that run wrote converts to Hugging Face and back, and the
#               /model datasets equal the original's bit for bit (h5diff)
#   init-round  the same for `cubelm init`'s step-0 checkpoint
# Needs a Python 3.11+ that imports numpy; without one it prints "SKIP: ..." and exits 77.
# Prints "PASS: hf convert" at the end, "FAIL: ..." on the first failure.
set -uo pipefail
work=$1 cubelm=$(realpath "$2")
shift 2
launcher=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case_name=setup
fail() { echo "FAIL: $case_name: $*"; exit 1; }

# shellcheck source=../scripts/lib.sh
source "$root/scripts/lib.sh"
if ! py=$(cubelm_python numpy 2>/dev/null); then
  echo "SKIP: no Python 3.11+ that imports numpy (tried: ${CUBELM_PYTHON:-python3 /usr/bin/python3});" \
       "on Debian: apt-get install python3-numpy, or set CUBELM_PYTHON"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || fail "no work directory $work"

# The numpy side: a safetensors reader and writer and GPT-2's loss, written from the
# published formats and GPT-2's definition, nothing of cubelm's.
cat >hf_ref.py <<'EOF'
import json, sys
import numpy as np

def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: dtype {e['dtype']}")
        out[name] = a.reshape(e["shape"])
    return n, header, out

def write_safetensors(path, tensors, order):
    """tensors: name -> (dtype, numpy array as stored); data in the order of `order`."""
    header, chunks, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in order:
        dtype, a = tensors[name]
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    text = json.dumps(dict(sorted(header.items())))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text.encode())
        for c in chunks:
            f.write(c)

def make_model(directory, V, T, H, A, L, seed):
    rng = np.random.default_rng(seed)
    f32 = lambda *s, scale=0.1: (rng.standard_normal(s) * scale).astype("<f4")
    bf16 = lambda *s: ((f32(*s).view("<u4") >> 16).astype("<u2"))  # the top half of a float32
    p = "transformer."
    t = {p + "wte.weight": ("F32", f32(V, H, scale=0.3)),
         p + "wpe.weight": ("F16", (rng.standard_normal((T, H)) * 0.1).astype("<f2")),
         p + "ln_f.weight": ("F32", 1 + f32(H)), p + "ln_f.bias": ("BF16", bf16(H))}
    t["lm_head.weight"] = t[p + "wte.weight"]
    for l in range(L):
        h = f"{p}h.{l}."
        t.update({h + "ln_1.weight": ("F32", 1 + f32(H)), h + "ln_1.bias": ("BF16", bf16(H)),
                  h + "attn.c_attn.weight": ("F32", f32(H, 3 * H)), h + "attn.c_attn.bias": ("F32", f32(3 * H)),
                  h + "attn.c_proj.weight": ("F32", f32(H, H)), h + "attn.c_proj.bias": ("F32", f32(H)),
                  h + "ln_2.weight": ("F32", 1 + f32(H)), h + "ln_2.bias": ("BF16", bf16(H)),
                  h + "mlp.c_fc.weight": ("F32", f32(H, 4 * H)), h + "mlp.c_fc.bias": ("F32", f32(4 * H)),
                  h + "mlp.c_proj.weight": ("F32", f32(4 * H, H)), h + "mlp.c_proj.bias": ("F32", f32(H)),
                  h + "attn.bias": ("F32", np.tril(np.ones((T, T), "<f4")).reshape(1, 1, T, T)),
                  h + "attn.masked_bias": ("F32", np.array(-1e4, "<f4"))})
    write_safetensors(f"{directory}/model.safetensors", t, sorted(t, reverse=True))
    config = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
              "attn_pdrop": 0.1, "bos_token_id": V - 1, "embd_pdrop": 0.1, "eos_token_id": V - 1,
              "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
              "n_ctx": T, "n_embd": H, "n_head": A, "n_layer": L, "n_positions": T,
              "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
              "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
              "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
              "vocab_size": V}
    with open(f"{directory}/config.json", "w") as f:
        json.dump(config, f, indent=2)

def write_tokens(path, V, count, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, count).astype("<u2")
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, count]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())

def loss(directory, tokens_path, B):
    """GPT-2's mean cross-entropy of step 0's batch (docs/data.md's sequential sampler)."""
    config = json.load(open(f"{directory}/config.json"))
    _, _, w = read_safetensors(f"{directory}/model.safetensors")
    w = {(k[len("transformer."):] if k.startswith("transformer.") else k): v.astype(np.float64)
         for k, v in w.items()}
    T, H, A, L = config["n_positions"], config["n_embd"], config["n_head"], config["n_layer"]
    eps = config.get("layer_norm_epsilon", 1e-5)
    tokens = np.fromfile(tokens_path, dtype="<u2", offset=1024).astype(np.int64)
    starts = [(k * T) % (len(tokens) - T - 1) for k in range(B)]
    inp = np.stack([tokens[s:s + T] for s in starts])
    tgt = np.stack([tokens[s + 1:s + T + 1] for s in starts])
    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b
    gelu = lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    D = H // A
    x = w["wte.weight"][inp] + w["wpe.weight"][:T]
    causal = np.tril(np.ones((T, T), bool))
    for l in range(L):
        h = f"h.{l}."
        y = ln(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"])
        qkv = y @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]
        q, k, v = (a.reshape(B, T, A, D).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, axis=-1))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
        s = np.where(causal, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True)) @ v
        x = x + o.transpose(0, 2, 1, 3).reshape(B, T, H) @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        y = ln(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"])
        x = x + gelu(y @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"]) @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    logits = ln(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return float(np.mean(lse - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]))

def logits(directory, ids):
    """The logits of every position of the sequence `ids`, in float64: [len(ids), V]."""
    config = json.load(open(f"{directory}/config.json"))
    _, _, w = read_safetensors(f"{directory}/model.safetensors")
    w = {(k[len("transformer."):] if k.startswith("transformer.") else k): v.astype(np.float64)
         for k, v in w.items()}
    H, A, L = config["n_embd"], config["n_head"], config["n_layer"]
    eps = config.get("layer_norm_epsilon", 1e-5)
    T, D = len(ids), H // A
    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b
    gelu = lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    x = w["wte.weight"][np.array(ids)] + w["wpe.weight"][:T]
    causal = np.tril(np.ones((T, T), bool))
    for l in range(L):
        h = f"h.{l}."
        y = ln(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"])
        qkv = y @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]
        q, k, v = (a.reshape(T, A, D).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))
        s = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(D), -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True)) @ v
        x = x + o.transpose(1, 0, 2).reshape(T, H) @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        y = ln(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"])
        x = x + gelu(y @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"]) @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    return ln(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T

def check_logits(directory, prompt_path, generated_path, logits_path):
    """cubelm's logits (--logits) of the prompt's last position and of each generated token but
    the last equal numpy's within 1e-5 of the largest logit's magnitude."""
    prompt = [int(t) for t in open(prompt_path).read().split()]
    generated = [int(t) for t in open(generated_path).read().split()]
    V = json.load(open(f"{directory}/config.json"))["vocab_size"]
    got = np.fromfile(logits_path, dtype="<f4").reshape(-1, V).astype(np.float64)
    assert got.shape[0] == len(generated), f"{got.shape[0]} rows of logits for {len(generated)} tokens"
    ids = prompt + generated[:-1]
    want = logits(directory, ids)[len(prompt) - 1:]
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"logits of {len(generated)} positions ({len(prompt)}-token prompt): largest difference "
          f"{err:.2e} of the largest logit")
    assert err <= 1e-5, "cubelm's logits differ from numpy's"
    assert generated == [int(r.argmax()) for r in want], "greedy tokens differ from numpy's argmax"

def check_export(original, exported):
    """exported (cubelm's model.safetensors and config.json) holds original's model."""
    n, header, out = read_safetensors(f"{exported}/model.safetensors")
    _, _, inp = read_safetensors(f"{original}/model.safetensors")
    config = json.load(open(f"{exported}/config.json"))
    L, V = config["n_layer"], config["vocab_size"]
    names = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}
    for l in range(L):
        names |= {f"h.{l}.{t}.{p}" for t in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
                  for p in ("weight", "bias")}
    assert set(out) == names, f"names: {sorted(set(out) ^ names)}"
    assert (8 + n) % 8 == 0, f"header of {n} bytes: the data is not 8-byte aligned"
    assert header["__metadata__"]["format"] == "pt", header["__metadata__"]
    spans = sorted(tuple(e["data_offsets"]) for k, e in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "data not contiguous"
    for name in names:
        assert header[name]["dtype"] == "F32", f"{name}: {header[name]['dtype']}"
        a, b = out[name], inp["transformer." + name]
        assert a.shape == b.shape and np.array_equal(a.view("<u4"), b.astype("<f4").view("<u4")), \
            f"{name} differs from the input"
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-05, "n_inner": None, "tie_word_embeddings": True,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "initializer_range": 0.02, "bos_token_id": V - 1, "eos_token_id": V - 1,
            "torch_dtype": "float32", "use_cache": True, "n_positions": 16, "n_ctx": 16, "n_embd": 32,
            "n_head": 4, "n_layer": 2, "vocab_size": 96}
    for k, v in want.items():
        assert k in config and config[k] == v, f"config.json {k} = {config.get(k, '(missing)')}, expected {v}"
    print(f"{exported}: {len(names)} tensors equal the input's, config.json as GPT2Config writes it")

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "make":
        make_model(sys.argv[2], 96, 16, 32, 4, 2, seed=11)
        write_tokens(sys.argv[3], 96, 3000, seed=12)
    elif what == "loss":
        print(repr(loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    elif what == "logits":
        check_logits(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    elif what == "check-export":
        check_export(sys.argv[2], sys.argv[3])
EOF

# deck NAME STEPS METRICS [PARALLEL LINES...]: a deck that starts from from_hf.h5.
deck() {
  local name=$1 steps=$2 metrics=$3
  shift 3
  {
    printf '[model]\nvocab_size = 96\nseq_len = 16\nhidden = 32\nheads = 4\nlayers = 2\n'
    printf '[parallel]\n'
    printf '%s\n' "$@"
    printf '[train]\nsteps = %s\nglobal_batch = 4\nseed = 5\n[optimizer]\nlr = 1e-3\n' "$steps"
    printf '[data]\nformat = "llmc"\npath = "tokens.bin"\nsampler = "sequential"\n'
    printf '[checkpoint]\ndir = "ckpt_%s"\nresume = "from_hf.h5"\nallow_other_run = true\n' "$name"
    printf '[log]\nmetrics = "%s"\npeak_gflops = 1.0\n' "$metrics"
  } >"$name.toml"
}

# loss_of METRICS STEP: the loss of that step in a metrics file.
loss_of() {
  "$py" -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("step") == int(sys.argv[2]) and "loss" in r:
        print(repr(r["loss"])); break' "$1" "$2"
}

# close A B: |A - B| <= 1e-5 |B|; prints the difference.
close() {
  "$py" -c 'import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
d = abs(a - b) / abs(b)
print(f"cubelm {a!r} numpy {b!r}: relative difference {d:.2e}")
sys.exit(0 if d <= 1e-5 else 1)' "$1" "$2"
}

# same_model A B: the /model datasets of two checkpoints are equal, bit for bit.
same_model() {
  if command -v h5diff >/dev/null; then
    h5diff "$1" "$2" /model /model >h5diff.log 2>&1 || fail "$1 and $2 differ in /model: $(head -n 5 h5diff.log)"
  else
    # No HDF5 tools: compare what cubelm exports of each (the exporter is checked above).
    "$cubelm" convert --to hf "$1" -o cmp_a >/dev/null && "$cubelm" convert --to hf "$2" -o cmp_b >/dev/null ||
      fail "cannot export $1 or $2"
    cmp -s cmp_a/model.safetensors cmp_b/model.safetensors || fail "$1 and $2 differ in /model"
    echo "(h5diff not found: compared the exports of the two checkpoints)"
  fi
}

case_name=reference
mkdir hf_in && "$py" hf_ref.py make hf_in tokens.bin || fail "cannot write the Hugging Face model"
"$cubelm" convert --from hf hf_in -o from_hf.h5 >convert.log 2>&1 || fail "convert --from hf: $(tail -n 3 convert.log)"
cat convert.log
reference=$("$py" hf_ref.py loss hf_in tokens.bin 4) || fail "numpy's loss"
deck one 1 m1.jsonl
"$cubelm" train one.toml >one.log 2>&1 || fail "cubelm train one.toml: $(tail -n 5 one.log)"
grep -q "allow_other_run" one.log || fail "the run did not say it resumed another run's checkpoint: $(head -n 20 one.log)"
loss=$(loss_of m1.jsonl 0)
[ -n "$loss" ] || fail "no loss of step 0 in m1.jsonl"
close "$loss" "$reference" || fail "cubelm's loss differs from numpy's (above)"

case_name=logits
# The logits `cubelm generate` draws greedy tokens from, against numpy's of the same model.
echo "5 17 3 88 42 9" >prompt.txt
"$cubelm" generate from_hf.h5 --prompt-tokens prompt.txt --tokens 6 --temperature 0 --logits logits.f32 \
  >generated.txt 2>generate.err || fail "cubelm generate: $(cat generate.err)"
"$py" hf_ref.py logits hf_in prompt.txt generated.txt logits.f32 || fail "the logits differ (above)"

case_name=export
"$cubelm" convert --to hf from_hf.h5 -o hf_out >export.log 2>&1 || fail "convert --to hf: $(tail -n 3 export.log)"
cat export.log
"$py" hf_ref.py check-export hf_in hf_out || fail "the export is not the input (above)"

case_name=tp-train
deck tp 3 m2.jsonl 'tensor_mode = "1d"' 'tensor_size = 2'
"${launcher[@]}" "$cubelm" train tp.toml >tp.log 2>&1 || fail "2-rank cubelm train tp.toml: $(tail -n 5 tp.log)"
grep '^step' tp.log
loss=$(loss_of m2.jsonl 0)
[ -n "$loss" ] || fail "no loss of step 0 in m2.jsonl"
close "$loss" "$reference" || fail "the 2-rank run's first loss differs from numpy's (above)"
[ -f ckpt_tp/step_00000003.h5 ] || fail "no checkpoint ckpt_tp/step_00000003.h5 after 3 steps"

case_name=tp-export
"$cubelm" convert --to hf ckpt_tp/step_00000003.h5 -o hf_tp >/dev/null 2>tp_export.err || fail "$(cat tp_export.err)"
"$cubelm" convert --from hf hf_tp -o tp_back.h5 >/dev/null 2>tp_back.err || fail "$(cat tp_back.err)"
same_model ckpt_tp/step_00000003.h5 tp_back.h5
echo "ckpt_tp/step_00000003.h5 (trained on 2 ranks, 1d) -> Hugging Face -> cubelm: /model equal"

case_name=init-round
printf '[model]\nvocab_size = 96\nseq_len = 16\nhidden = 32\nheads = 4\nlayers = 2\n[train]\nglobal_batch = 4\nseed = 3\n' >init.toml
"$cubelm" init init.toml -o init.h5 >/dev/null 2>init.err || fail "cubelm init: $(cat init.err)"
"$cubelm" convert --to hf init.h5 -o hf_init >/dev/null 2>init_export.err || fail "$(cat init_export.err)"
"$cubelm" convert --from hf hf_init -o init_back.h5 >/dev/null 2>init_back.err || fail "$(cat init_back.err)"
same_model init.h5 init_back.h5
echo "init.h5 -> Hugging Face -> cubelm: /model equal"
echo "PASS: hf convert"
