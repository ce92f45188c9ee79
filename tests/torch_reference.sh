#!/usr/bin/env bash
# The PyTorch reference perf/torch_gpt2.py (docs/perf-runs.md, "PyTorch reference on
# a GPU") against cubelm:
#
#   torch_reference.sh WORKDIR CUBELM CASE
#
# CASE:
#   smoke      --model tiny --device cpu --steps 2: the output line's fields and the
#              JSON file's keys; the parameter count and FLOPs per token of the tiny
#              and gpt2-124m presets equal what `cubelm check --json` says for the
#              same shapes
#   llmc       the same function as cubelm: `cubelm init` writes a step-0 checkpoint
#              of a small deck (vocabulary 96, padded to 128; an llm.c token file
#              written here, the sequential sampler; lr warm-up then cosine), cubelm
#              trains 3 steps in fp32 on one process, torch_gpt2.py --check-against
#              trains the same 3 steps from the checkpoint in float64 on the CPU
#              (fused qkv); every step's loss agrees within 1e-4 relative, and each
#              tensor's update agrees with cubelm's final checkpoint within 1e-3
#              (but attn/bk, whose gradient is zero but for rounding)
#   synthetic  the same on cubelm's synthetic corpus with the shuffle sampler (the
#              Python copy of the generator and sampler), float32, separate q/k/v
#              weights and the unfused attention formula
# Needs a Python 3.11+ that imports torch, h5py and numpy (Debian: python3-torch,
# python3-h5py); without one it prints "SKIP: ..." and exits with 77 (a skip for
# CTest). Prints "PASS: CASE" at the end, "FAIL: ..." on the first failure.
set -uo pipefail
work=$1
cubelm=$(realpath "$2")
case=$3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
script=$root/perf/torch_gpt2.py
fail() { echo "FAIL: $*"; exit 1; }

# shellcheck source=../scripts/lib.sh
source "$root/scripts/lib.sh"
if ! py=$(cubelm_python torch h5py numpy 2>/dev/null); then
  echo "SKIP: no Python 3.11+ that imports torch, h5py and numpy (tried: ${CUBELM_PYTHON:-python3 /usr/bin/python3});" \
       "on Debian: apt-get install python3-torch python3-h5py, or set CUBELM_PYTHON"
  exit 77
fi
echo "python: $py ($("$py" -c 'import torch; print("torch", torch.__version__)'))"

rm -rf "$work"
mkdir -p "$work"
cd "$work" || fail "cannot enter $work"

# check_counts JSON DECK: `cubelm check --json DECK` agrees with JSON (what
# torch_gpt2.py --dry-run writes for the same shape) on the parameters and the FLOPs
# per token.
check_counts() {
  local json=$1 deck=$2
  "$cubelm" check --json "$deck" >check.json 2>check.err || fail "cubelm check $deck: $(tail -n 3 check.err)"
  "$py" - "$json" check.json <<'EOF' || fail "the FLOP count differs from cubelm's (above)"
import json, sys
torch_rec = json.load(open(sys.argv[1]))[0]
cubelm = json.load(open(sys.argv[2]))
per_token = cubelm["flops_per_step"] / cubelm["tokens_per_step"]
print(f"{torch_rec['model']}: parameters torch {torch_rec['params']} cubelm {cubelm['parameters']}; "
      f"FLOPs per token torch {torch_rec['flops_per_token']:.0f} cubelm {per_token:.0f}")
sys.exit(0 if torch_rec["params"] == cubelm["parameters"]
         and abs(torch_rec["flops_per_token"] - per_token) <= 1e-9 * per_token else 1)
EOF
}

case $case in
smoke)
  out=$("$py" "$script" --model tiny --device cpu --steps 2 --warmup 1 --precision fp32 \
    --json tiny.json 2>&1) || fail "torch_gpt2.py failed: $out"
  echo "$out"
  line=$(grep '^torch_gpt2 ' <<<"$out")
  [ "$(wc -l <<<"$line")" = 1 ] || fail "expected one result line, got: $line"
  for field in model=tiny precision=fp32 compile=off batch=8 seq=64 'ms_per_step=[0-9.]+' \
               'tok/s=[0-9.]+' 'GFLOP/s=[0-9.]+' params_M=0.12 'device="cpu' 'torch=[0-9]'; do
    grep -qE " $field" <<<"$line" || fail "no field /$field/ in: $line"
  done
  grep -q "MFU=" <<<"$line" && fail "MFU without a peak on the CPU: $line"
  "$py" - tiny.json <<'EOF' || fail "tiny.json is not as documented"
import json, sys
recs = json.load(open(sys.argv[1]))
assert isinstance(recs, list) and len(recs) == 1, recs
r = recs[0]
for key in ("model", "precision", "compile", "batch", "tokens_per_s", "tflops", "mfu",
            "ms_per_step", "device", "torch"):
    assert key in r, f"no key {key}"
assert r["model"] == "tiny" and r["precision"] == "fp32" and r["compile"] == "off", r
assert r["batch"] == 8 and r["mfu"] is None, r
assert r["tokens_per_s"] > 0 and abs(r["tokens_per_s"] * r["ms_per_step"] / 1e3 - 8 * 64) < 1e-6
assert abs(r["tflops"] * 1e12 - r["flops_per_token"] * r["tokens_per_s"]) < 1e-6 * r["tflops"] * 1e12
print("tiny.json: keys and figures consistent")
EOF
  # With --peak-tflops an MFU; with --compile either a compiled row or a skipped one.
  out=$("$py" "$script" --model tiny --device cpu --steps 1 --warmup 0 --precision bf16 \
    --compile --peak-tflops 1 2>&1) || fail "torch_gpt2.py --compile failed: $out"
  echo "$out"
  grep -qE "^torch_gpt2 model=tiny precision=bf16 compile=(on .* MFU=[0-9.]+ |skipped .*SKIPPED: torch.compile)" \
    <<<"$out" || fail "no compiled or skipped bf16 row: $out"
  # The FLOP count is cubelm's: tiny (perf/bench_train's) and GPT-2 124M.
  "$py" "$script" --model tiny --dry-run --json tiny-shape.json >/dev/null || fail "--dry-run failed"
  printf '[model]\nvocab_size = 256\nseq_len = 64\nhidden = 64\nheads = 4\nlayers = 2\n[train]\nglobal_batch = 8\n' >tiny.toml
  check_counts tiny-shape.json tiny.toml
  "$py" "$script" --model gpt2-124m --dry-run --json gpt2-shape.json >/dev/null || fail "--dry-run failed"
  printf '[model]\nvocab_size = 50257\nseq_len = 1024\nhidden = 768\nheads = 12\nlayers = 12\n[train]\nglobal_batch = 8\n' >gpt2.toml
  check_counts gpt2-shape.json gpt2.toml
  ;;
llmc | synthetic)
  if [ "$case" = llmc ]; then
    # 4000 tokens below 96 from a seeded generator, as an llm.c file (docs/data.md).
    "$py" - tokens.bin <<'EOF' || fail "cannot write the token file"
import sys
import numpy as np
rng = np.random.default_rng(7)
tokens = (np.cumsum(rng.integers(1, 4, 4000)) * 7 % 96).astype("<u2")
header = np.zeros(256, dtype="<i4")
header[:3] = [20240520, 1, len(tokens)]
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
EOF
    data="format = \"llmc\"
path = \"$work/tokens.bin\"
sampler = \"sequential\""
    seed=1234
    options=(--dtype float64 --qkv fused --attention auto)
  else
    data="synthetic_tokens = 5000
synthetic_branching = 3"
    seed=77
    options=(--dtype float32 --qkv separate --attention manual)
  fi
  cat >deck.toml <<EOF
# The reference check of tests/torch_reference.sh ($case).
[model]
vocab_size = 96
seq_len = 16
hidden = 32
heads = 4
layers = 2
[train]
steps = 3
global_batch = 4
seed = $seed
precision = "fp32"
[optimizer]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
weight_decay = 0.1
grad_clip = 1.0
[data]
$data
[log]
metrics = "metrics.jsonl"
peak_gflops = 1.0
[checkpoint]
dir = "ckpt"
EOF
  "$cubelm" init deck.toml -o init.h5 >init.log 2>&1 || fail "cubelm init: $(tail -n 3 init.log)"
  "$cubelm" train deck.toml >train.log 2>&1 || fail "cubelm train: $(tail -n 5 train.log)"
  grep '^step' train.log
  [ -f ckpt/step_00000003.h5 ] || fail "no checkpoint ckpt/step_00000003.h5 after 3 steps"
  "$py" "$script" --check-against init.h5 --metrics metrics.jsonl --final ckpt/step_00000003.h5 \
    --rtol 1e-4 "${options[@]}" || fail "torch_gpt2.py does not agree with cubelm (above)"
  ;;
*)
  fail "unknown case $case"
  ;;
esac
echo "PASS: $case"
