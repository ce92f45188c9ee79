#!/usr/bin/env python3
"""A PyTorch reference for cubelm's GPT-2: the same model, optimizer and FLOP count.

Two uses (docs/perf-runs.md, "PyTorch reference on a GPU"):

* Speed. Training steps of the model of docs/model.md at a chosen shape,
  precision and micro-batch, timed like perf/bench_train's GPT-2 rows, one line
  per configuration (tokens/s, model GFLOP/s, MFU) and optionally a JSON file:

    perf/torch_gpt2.py --model gpt2-124m --precision fp32,tf32,bf16 --compile both \
        --batch 8 --json torch.json

* Agreement. --check-against FILE.h5 starts from a cubelm checkpoint (e.g. the
  one `cubelm init DECK -o FILE.h5` writes), reads the deck stored in it, makes
  the same tokens (the synthetic corpus, an llm.c, Megatron or text file) with
  the same sampler, trains the deck's steps with the deck's optimizer and prints
  the loss and gradient norm of each step; --metrics FILE.jsonl compares them
  with a cubelm run of the same deck (`[log] metrics`).

The model (docs/model.md): pre-LayerNorm blocks, LayerNorm eps 1e-5, GELU
(tanh), learned positions, tied embeddings (logits = x wte^T), biases on every
linear, causal attention over heads that are contiguous blocks of H/a features.
q, k and v come from one fused [3H, H] weight by default (--qkv separate keeps
three): the same function, since a product with the concatenation is the
concatenation of the products. Weights are stored as torch.nn.Linear keeps them,
[out, in]; cubelm stores [in, out], so checkpoints are transposed on the way in.
Attention runs through torch.nn.functional.scaled_dot_product_attention where
torch has it (2.0 and later): fused attention (flash or memory-efficient kernels
on GPUs) that never stores the T x T scores; cubelm computes the scores and the
softmax as separate kernels. --attention manual uses the unfused formula.

The vocabulary is padded as cubelm pads it on one process: to a multiple of
--vocab-divisible-by (default 128, cubelm's model.vocab_divisible_by), so GPT-2's
50257 becomes 50304. The padded rows of wte start at zero and their logits are
left out of the loss (the logits are sliced to the real V before the
cross-entropy), so they get no gradient and stay zero, as in cubelm.

AdamW as torch.optim.AdamW (cubelm implements exactly it): betas (0.9, 0.95),
eps 1e-8, weight decay 0.1 on tensors of rank >= 2 only (wte and wpe included),
global-norm clipping at 1.0 (torch.nn.utils.clip_grad_norm_), cubelm's learning
rate schedule (linear warm-up, then cosine to min_lr). The fused CUDA AdamW is
used where torch has it; it computes the same update.

FLOPs per token are cubelm's cost::flops_per_token (include/cubelm/cost/shape.hpp)
for a dense model: 6 N + 12 L H T, with N the parameters counted with the real
vocabulary V (not the padded one): V H + T H + L (12 H^2 + 13 H) + 2 H.

Precision (docs/precision.md): fp32 (IEEE fp32 products), tf32 (fp32 products
on TF32 tensor cores; the same as fp32 on CPUs) and bf16 (torch.autocast to
bfloat16 around forward and loss, fp32 master weights, gradients and AdamW).
Under autocast the products write bf16, so GELU, attention (its softmax too) and
the logits see bf16 values, while LayerNorm, the residual stream (fp32 + bf16 is
fp32) and the loss stay fp32; cubelm's bf16 products take bf16 inputs but write
fp32, and every other kernel of cubelm is fp32.

Runs on torch 1.13 (no torch.compile: --compile is then reported as skipped,
and attention is the manual formula) and on torch 2.x.
"""

import argparse
import gc
import inspect
import json
import math
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# cubelm's data pipeline, beside this file (perf/cubelm_data.py)
from cubelm_data import MASK64, Rng, Sampler, read_tokens, synthetic_corpus

# ------------------------------------------------------------------ shapes --

# L, H, a, T, V, micro-batch: perf/bench_train.cpp's rows.
PRESETS = {
    "gpt2-124m": dict(layers=12, hidden=768, heads=12, seq=1024, vocab=50257, batch=8),
    "small": dict(layers=4, hidden=256, heads=8, seq=256, vocab=8192, batch=8),
    "tiny": dict(layers=2, hidden=64, heads=4, seq=64, vocab=256, batch=8),
}

# Dense peak TFLOP/s of one GPU by precision (NVIDIA's data sheet, no sparsity).
PEAK_TFLOPS = {"h100": {"bf16": 989.0, "tf32": 494.0, "fp32": 67.0}}


def padded_vocab(vocab, divisible_by):
    return (vocab + divisible_by - 1) // divisible_by * divisible_by


def parameter_count(layers, hidden, seq, vocab):
    """cubelm's cost::parameter_count for a dense model (real vocabulary)."""
    h = hidden
    return vocab * h + seq * h + layers * (12 * h * h + 13 * h) + 2 * h


def flops_per_token(layers, hidden, seq, vocab):
    """cubelm's cost::flops_per_token: 6 N + 12 L H T (include/cubelm/cost/shape.hpp)."""
    return 6.0 * parameter_count(layers, hidden, seq, vocab) + 12.0 * layers * hidden * seq


# ------------------------------------------------------------------- model --


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


class Block(torch.nn.Module):
    def __init__(self, hidden, heads, fused_qkv, attention, dtype, device):
        super().__init__()
        h = hidden
        kw = dict(dtype=dtype, device=device)
        self.heads = heads
        self.fused_qkv = fused_qkv
        self.attention = attention
        P = torch.nn.Parameter
        self.ln1_gamma, self.ln1_beta = P(torch.ones(h, **kw)), P(torch.zeros(h, **kw))
        if fused_qkv:
            self.w_qkv, self.b_qkv = P(torch.empty(3 * h, h, **kw)), P(torch.zeros(3 * h, **kw))
        else:
            self.wq, self.bq = P(torch.empty(h, h, **kw)), P(torch.zeros(h, **kw))
            self.wk, self.bk = P(torch.empty(h, h, **kw)), P(torch.zeros(h, **kw))
            self.wv, self.bv = P(torch.empty(h, h, **kw)), P(torch.zeros(h, **kw))
        self.wo, self.bo = P(torch.empty(h, h, **kw)), P(torch.zeros(h, **kw))
        self.ln2_gamma, self.ln2_beta = P(torch.ones(h, **kw)), P(torch.zeros(h, **kw))
        self.w1, self.b1 = P(torch.empty(4 * h, h, **kw)), P(torch.zeros(4 * h, **kw))
        self.w2, self.b2 = P(torch.empty(h, 4 * h, **kw)), P(torch.zeros(h, **kw))

    def forward(self, x):
        B, T, H = x.shape
        a = self.heads
        y = F.layer_norm(x, (H,), self.ln1_gamma, self.ln1_beta, 1e-5)
        if self.fused_qkv:
            q, k, v = F.linear(y, self.w_qkv, self.b_qkv).split(H, dim=2)
        else:
            q = F.linear(y, self.wq, self.bq)
            k = F.linear(y, self.wk, self.bk)
            v = F.linear(y, self.wv, self.bv)
        # Heads are contiguous column blocks of H/a features.
        q, k, v = (t.view(B, T, a, H // a).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(H // a))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(causal, float("-inf"))
            o = torch.matmul(torch.softmax(s, dim=-1), v)
        o = o.transpose(1, 2).reshape(B, T, H)
        x = x + F.linear(o, self.wo, self.bo)
        y = F.layer_norm(x, (H,), self.ln2_gamma, self.ln2_beta, 1e-5)
        return x + F.linear(F.gelu(F.linear(y, self.w1, self.b1), approximate="tanh"), self.w2,
                            self.b2)


class GPT(torch.nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab, vocab_divisible_by=128,
                 fused_qkv=True, attention="sdpa", dtype=torch.float32, device="cpu"):
        super().__init__()
        if hidden % heads:
            raise SystemExit(f"torch_gpt2: hidden {hidden} is not divisible by heads {heads}")
        self.vocab = vocab
        self.padded = padded_vocab(vocab, vocab_divisible_by)
        kw = dict(dtype=dtype, device=device)
        self.wte = torch.nn.Parameter(torch.zeros(self.padded, hidden, **kw))
        self.wpe = torch.nn.Parameter(torch.empty(seq, hidden, **kw))
        self.blocks = torch.nn.ModuleList(
            Block(hidden, heads, fused_qkv, attention, dtype, device) for _ in range(layers))
        self.lnf_gamma = torch.nn.Parameter(torch.ones(hidden, **kw))
        self.lnf_beta = torch.nn.Parameter(torch.zeros(hidden, **kw))

    def init_weights(self, seed):
        """docs/model.md: N(0, 0.02), wo and w2 N(0, 0.02/sqrt(2L)), biases 0, gamma 1,
        beta 0, the padded rows of wte 0 (torch's own generator, not cubelm's values)."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        std, out_std = 0.02, 0.02 / math.sqrt(2 * len(self.blocks))

        def normal(p, s):
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * s)

        normal(self.wte, std)
        with torch.no_grad():
            self.wte[self.vocab:].zero_()
        normal(self.wpe, std)
        for b in self.blocks:
            for name in ("w_qkv", "wq", "wk", "wv", "w1"):
                if hasattr(b, name):
                    normal(getattr(b, name), std)
            normal(b.wo, out_std)
            normal(b.w2, out_std)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = F.embedding(idx, self.wte) + self.wpe[:T]
        for b in self.blocks:
            x = b(x)
        x = F.layer_norm(x, (x.shape[-1],), self.lnf_gamma, self.lnf_beta, 1e-5)
        logits = F.linear(x, self.wte)  # tied head: x wte^T
        if self.padded != self.vocab:  # the padded rows are never predicted
            logits = logits[..., :self.vocab]
        return F.cross_entropy(logits.reshape(B * T, self.vocab).float(), targets.reshape(B * T))


# ------------------------------------------------ cubelm's names and layout --


def cubelm_tensors(model):
    """The model's tensors under cubelm's checkpoint names, [in, out] as cubelm stores
    them (views of the parameters: a transposed view, or a block of the fused qkv)."""
    out = {"wte": model.wte[:model.vocab], "wpe": model.wpe,
           "ln_f/gamma": model.lnf_gamma, "ln_f/beta": model.lnf_beta}
    for l, b in enumerate(model.blocks):
        p = f"layers/{l}/"
        h = b.wo.shape[0]
        out[p + "ln1/gamma"], out[p + "ln1/beta"] = b.ln1_gamma, b.ln1_beta
        out[p + "ln2/gamma"], out[p + "ln2/beta"] = b.ln2_gamma, b.ln2_beta
        for i, n in enumerate("qkv"):
            if b.fused_qkv:
                out[p + f"attn/w{n}"] = b.w_qkv[i * h:(i + 1) * h].t()
                out[p + f"attn/b{n}"] = b.b_qkv[i * h:(i + 1) * h]
            else:
                out[p + f"attn/w{n}"] = getattr(b, "w" + n).t()
                out[p + f"attn/b{n}"] = getattr(b, "b" + n)
        out[p + "attn/wo"], out[p + "attn/bo"] = b.wo.t(), b.bo
        out[p + "mlp/w1"], out[p + "mlp/b1"] = b.w1.t(), b.b1
        out[p + "mlp/w2"], out[p + "mlp/b2"] = b.w2.t(), b.b2
    return out


def load_cubelm(model, arrays):
    """Copies a checkpoint's /model tensors into the model (transposing [in, out])."""
    views = cubelm_tensors(model)
    missing = sorted(set(views) - set(arrays))
    extra = sorted(set(arrays) - set(views))
    if missing or extra:
        raise SystemExit("torch_gpt2: the checkpoint's tensors do not match the model: missing "
                         f"{missing[:5]}, unexpected {extra[:5]}")
    with torch.no_grad():
        model.wte.zero_()
        for name, view in views.items():
            a = torch.as_tensor(arrays[name])
            if tuple(a.shape) != tuple(view.shape):
                raise SystemExit(f"torch_gpt2: /model/{name} has shape {tuple(a.shape)}, the "
                                 f"model {tuple(view.shape)}")
            view.copy_(a.to(view.dtype))


# --------------------------------------------------------------- training --


def learning_rate(opt, steps, step):
    """cubelm's train::learning_rate (src/train/lr_schedule.cpp)."""
    if step < opt["warmup_steps"]:
        return opt["lr"] * (step + 1) / opt["warmup_steps"]
    decay_steps = steps - opt["warmup_steps"]
    if decay_steps <= 0:
        return opt["lr"]
    progress = (step - opt["warmup_steps"]) / decay_steps
    return opt["min_lr"] + 0.5 * (opt["lr"] - opt["min_lr"]) * (
        1.0 + math.cos(math.pi * min(1.0, progress)))


DEFAULT_OPTIMIZER = dict(lr=6e-4, min_lr=6e-5, warmup_steps=0, weight_decay=0.1, beta1=0.9,
                         beta2=0.95, eps=1e-8, grad_clip=1.0)


def make_adamw(model, opt, device):
    """AdamW with weight decay on tensors of rank >= 2 only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": opt["weight_decay"]},
              {"params": other, "weight_decay": 0.0}]
    kw = dict(lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    impl = "plain"
    params = inspect.signature(torch.optim.AdamW).parameters
    if str(device).startswith("cuda") and "fused" in params:
        kw["fused"], impl = True, "fused"
    elif "foreach" in params and str(device).startswith("cuda"):
        kw["foreach"], impl = True, "foreach"
    elif "foreach" in params:
        kw["foreach"] = False
    return torch.optim.AdamW(groups, **kw), impl


def set_matmul_precision(precision):
    """fp32: IEEE products; tf32: TF32 tensor cores for fp32 products. One call that sets
    cuBLAS's setting consistently in every torch from 1.12 on."""
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")


class Stepper:
    """One training step: forward and loss (under autocast for bf16), backward, global-norm
    clipping, the learning rate of the step, AdamW."""

    def __init__(self, model, forward, optimizer, opt, steps, precision, device):
        self.model, self.forward, self.optimizer = model, forward, optimizer
        self.opt, self.steps, self.precision = opt, steps, precision
        self.device_type = "cuda" if str(device).startswith("cuda") else "cpu"
        self.params = [p for p in model.parameters()]
        self.step_no = 0

    def __call__(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        if self.precision == "bf16":
            with torch.autocast(device_type=self.device_type, dtype=torch.bfloat16):
                loss = self.forward(x, y)
        else:
            loss = self.forward(x, y)
        loss.backward()
        if self.opt["grad_clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.opt["grad_clip"])
        else:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in self.params]))
        lr = learning_rate(self.opt, self.steps, self.step_no)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.step_no += 1
        return loss, norm, lr


# ------------------------------------------------------------------ speed --


def is_oom(e):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def free_cuda():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_name(device):
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    n = torch.get_num_threads()
    return f"cpu ({platform.processor() or platform.machine()}, {n} thread{'' if n == 1 else 's'})"


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def build(shape, precision, compile_mode, batch, args):
    """A model, its optimizer and stepper at micro-batch `batch`, after one step."""
    set_matmul_precision(precision)
    model = GPT(shape["layers"], shape["hidden"], shape["heads"], shape["seq"], shape["vocab"],
                args.vocab_divisible_by, args.qkv == "fused", args.attention_impl,
                torch.float32, args.device)
    model.init_weights(args.seed)
    forward = model
    if compile_mode:
        forward = torch.compile(model) if args.compile_mode is None else torch.compile(
            model, mode=args.compile_mode)
    optimizer, impl = make_adamw(model, DEFAULT_OPTIMIZER, args.device)
    stepper = Stepper(model, forward, optimizer, DEFAULT_OPTIMIZER, 1000, precision, args.device)
    g = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    data = [torch.randint(0, shape["vocab"], (batch, shape["seq"] + 1), generator=g)
            .to(args.device) for _ in range(2)]
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    stepper(*batches[0])  # the first step: allocation, autotuning, compilation
    sync(args.device)
    return model, stepper, batches, impl


AUTO_BATCH = {}  # --batch auto: the micro-batch found for each precision


def find_batch(shape, name, precision, args):
    """--batch auto: the largest power of two <= 64 whose training step runs (without
    torch.compile, which needs no more memory and would compile once per try)."""
    for b in [64 >> i for i in range(7)]:
        fits = False
        try:
            build(shape, precision, False, b, args)  # the model is dropped at once
            fits = True
        except Exception as e:  # noqa: BLE001
            if not is_oom(e):
                raise
        free_cuda()  # outside the handler, which held the failed step's frames
        if fits:
            print(f"torch_gpt2: {name} {precision}: micro-batch {b} fits", file=sys.stderr)
            return b
        print(f"torch_gpt2: {name} {precision}: micro-batch {b} runs out of memory, halving",
              file=sys.stderr)
    return None


def run_config(shape, name, precision, compile_mode, args):
    """Times one configuration; returns its record (figures, or why it was skipped)."""
    record = dict(model=name, precision=precision, compile="on" if compile_mode else "off",
                  batch=None, seq=shape["seq"], device=device_name(args.device),
                  torch=torch.__version__, attention=args.attention_impl, qkv=args.qkv,
                  params=parameter_count(shape["layers"], shape["hidden"], shape["seq"],
                                         shape["vocab"]),
                  flops_per_token=flops_per_token(shape["layers"], shape["hidden"],
                                                  shape["seq"], shape["vocab"]))
    if compile_mode and not hasattr(torch, "compile"):
        record["compile"] = "skipped"
        record["skipped"] = (f"torch.compile is not available in torch {torch.__version__} "
                             "(it needs torch 2.0 or later)")
        return record
    cuda = str(args.device).startswith("cuda")
    if args.batch == "auto" and cuda:
        if precision not in AUTO_BATCH:
            AUTO_BATCH[precision] = find_batch(shape, name, precision, args)
        batch = AUTO_BATCH[precision]
        if batch is None:
            record["skipped"] = "out of memory at micro-batch 1"
            return record
    elif args.batch == "auto":
        batch = shape["batch"]
        print(f"torch_gpt2: --batch auto searches on CUDA only; micro-batch {batch} on the CPU",
              file=sys.stderr)
    else:
        batch = int(args.batch) if args.batch else shape["batch"]
    record["batch"] = batch
    if compile_mode and hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    built, failure = None, None
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        built = build(shape, precision, compile_mode, batch, args)
    except Exception as e:  # noqa: BLE001 - out of memory, or a compiler that fails
        if not is_oom(e) and not compile_mode:
            raise
        failure = ("oom" if is_oom(e) else "compile", f"{type(e).__name__}: {e}"[:500])
    if built is None:  # freed here, outside the handler that held the failed step's frames
        free_cuda()
        if failure[0] == "oom":
            record["skipped"] = f"out of memory at micro-batch {batch}"
        else:
            record["compile"] = "skipped"
            record["skipped"] = f"torch.compile failed: {failure[1]}"
        return record
    model, stepper, batches, impl = built
    record["adamw"] = impl
    for i in range(args.warmup):
        stepper(*batches[i % 2])
    sync(args.device)
    times = []
    for i in range(args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        loss, _, _ = stepper(*batches[i % 2])
        sync(args.device)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    tokens = record["batch"] * shape["seq"]
    record["ms_per_step"] = seconds * 1e3
    record["tokens_per_s"] = tokens / seconds
    record["tflops"] = record["flops_per_token"] * tokens / seconds / 1e12
    peak = args.peak_tflops
    if peak is None and cuda:
        peak = PEAK_TFLOPS[args.gpu][precision]
    record["peak_tflops"] = peak
    record["mfu"] = record["tflops"] / peak if peak else None
    record["steps_timed"] = args.steps
    record["loss"] = float(loss)
    if cuda:
        record["max_mem_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    del model, stepper, batches, built
    free_cuda()
    return record


def line(r):
    head = (f"torch_gpt2 model={r['model']} precision={r['precision']} compile={r['compile']} "
            f"batch={r['batch'] if r['batch'] is not None else '-'} seq={r['seq']}")
    tail = f" device=\"{r['device']}\" torch={r['torch']}"
    if "skipped" in r:
        return head + f" SKIPPED: {r['skipped']}" + tail
    mfu = f" MFU={r['mfu']:.4f}" if r["mfu"] is not None else ""
    return (head + f" ms_per_step={r['ms_per_step']:.3f} tok/s={r['tokens_per_s']:.1f}"
            f" GFLOP/s={r['tflops'] * 1e3:.2f}{mfu} params_M={r['params'] / 1e6:.2f}" + tail)


def speed(args):
    if args.model:
        shape = dict(PRESETS[args.model])
        name = args.model
    else:
        shape = dict(PRESETS["tiny"])
        name = "custom"
    changed = [k for k in ("layers", "hidden", "heads", "seq", "vocab")
               if getattr(args, k) is not None]
    for key in changed:
        shape[key] = getattr(args, key)
    if changed and name != "custom":
        name += "+" + ",".join(f"{k}={shape[k]}" for k in changed)  # a preset changed by flags
    precisions = (args.precision or "fp32,tf32,bf16").split(",")
    for p in precisions:
        if p not in ("fp32", "tf32", "bf16"):
            raise SystemExit(f"torch_gpt2: --precision {p}: use fp32, tf32 or bf16")
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    if args.batch not in (None, "auto"):
        shape["batch"] = int(args.batch)
    if args.dry_run:
        n = parameter_count(shape["layers"], shape["hidden"], shape["seq"], shape["vocab"])
        record = dict(model=name, **shape, padded_vocab=padded_vocab(shape["vocab"],
                                                                     args.vocab_divisible_by),
                      params=n, flops_per_token=flops_per_token(
                          shape["layers"], shape["hidden"], shape["seq"], shape["vocab"]))
        print("torch_gpt2 " + " ".join(f"{k}={v}" for k, v in record.items()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump([record], f, indent=1)
        return 0
    records = []
    for p in precisions:
        for c in compiles:
            r = run_config(shape, name, p, c, args)
            print(line(r), flush=True)
            records.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


# ------------------------------------------------- agreement with cubelm --

def load_toml(text):
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            raise SystemExit("torch_gpt2: --check-against reads the deck stored in the "
                             "checkpoint with tomllib (Python 3.11 or later) or tomli; "
                             "neither is here")
    return tomllib.loads(text)


def read_checkpoint(path):
    import h5py
    arrays = {}
    with h5py.File(path, "r") as f:
        if f.attrs.get("format") not in ("cubelm-checkpoint", b"cubelm-checkpoint"):
            raise SystemExit(f"torch_gpt2: {path}: not a cubelm checkpoint (attribute format)")
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                arrays[name] = obj[()]

        f["model"].visititems(visit)
    return attrs, arrays


def deck_settings(deck):
    """The deck's keys that the loss depends on, with cubelm's defaults (docs/deck.md)."""
    m, t = deck.get("model", {}), deck.get("train", {})
    o, d = deck.get("optimizer", {}), deck.get("data", {})
    if m.get("experts", 0) > 1:
        raise SystemExit("torch_gpt2: the deck has an MoE model (model.experts > 1); this "
                         "reference is the dense GPT-2 only")
    model = dict(layers=m.get("layers", 2), hidden=m.get("hidden", 64), heads=m.get("heads", 4),
                 seq=m.get("seq_len", 64), vocab=m.get("vocab_size", 256),
                 vocab_divisible_by=m.get("vocab_divisible_by", 128))
    opt = dict(DEFAULT_OPTIMIZER)
    opt.update({k: o[k] for k in opt if k in o})
    if "min_lr" not in o:
        opt["min_lr"] = opt["lr"] / 10.0
    train = dict(steps=t.get("steps", 100), global_batch=t.get("global_batch", 8),
                 seed=t.get("seed", 1234) & MASK64, precision=t.get("precision", "fp32"))
    data = dict(format=d.get("format", "synthetic"), path=d.get("path", ""),
                sampler=d.get("sampler", "shuffle"),
                synthetic_tokens=d.get("synthetic_tokens", 1 << 20),
                synthetic_branching=d.get("synthetic_branching", 4))
    return model, opt, train, data


def check(args):
    import numpy as np
    attrs, arrays = read_checkpoint(args.check_against)
    deck = load_toml(attrs["deck"])
    shape, opt, train, data = deck_settings(deck)
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    precision = args.precision or "fp32"
    if precision not in ("fp32", "tf32", "bf16"):
        raise SystemExit(f"torch_gpt2: --precision {precision}: one of fp32, tf32, bf16 with "
                         "--check-against")
    set_matmul_precision(precision)
    model = GPT(shape["layers"], shape["hidden"], shape["heads"], shape["seq"], shape["vocab"],
                shape["vocab_divisible_by"], args.qkv == "fused", args.attention_impl, dtype,
                args.device)
    load_cubelm(model, arrays)
    if data["format"] == "synthetic":
        tokens = np.asarray(synthetic_corpus(shape["vocab"], data["synthetic_tokens"],
                                             data["synthetic_branching"], train["seed"]),
                            dtype=np.int64)
    else:
        tokens = read_tokens(data["format"], args.data or data["path"], shape["vocab"])
    sampler = Sampler(data["sampler"], len(tokens), train["global_batch"], shape["seq"],
                      train["seed"])
    optimizer, _ = make_adamw(model, opt, args.device)
    stepper = Stepper(model, model, optimizer, opt, train["steps"], precision, args.device)
    first = int(attrs.get("step", 0))
    stepper.step_no = first
    steps = args.steps if args.steps_given else train["steps"] - first
    T = shape["seq"]
    n = parameter_count(shape["layers"], shape["hidden"], shape["seq"], shape["vocab"])
    print(f"torch_gpt2: {args.check_against}: step {first}, {n} parameters, {len(tokens)} "
          f"{data['format']} tokens, sampler {data['sampler']}, torch {torch.__version__} "
          f"{args.dtype} {precision} on {args.device}")
    if first:
        print("torch_gpt2: note: the checkpoint's AdamW moments are not read; the steps start "
              "from zero moments", file=sys.stderr)
    results = []
    for s in range(first, first + steps):
        rows = [tokens[sampler.start(s, k):sampler.start(s, k) + T + 1]
                for k in range(train["global_batch"])]
        batch = torch.as_tensor(np.stack(rows), device=args.device)
        loss, norm, lr = stepper(batch[:, :-1], batch[:, 1:])
        results.append(dict(step=s, loss=float(loss), grad_norm=float(norm), lr=lr))
        print(f"step {s} | loss {float(loss):.9f} | gnorm {float(norm):.9f} | lr {lr:.3e}")
    status = 0
    if args.metrics:
        cubelm = {}
        for text in open(args.metrics):
            if text.strip():
                rec = json.loads(text)
                cubelm[rec["step"]] = rec
        worst = 0.0
        for r in results:
            c = cubelm.get(r["step"])
            if c is None:
                print(f"FAIL: {args.metrics} has no step {r['step']}")
                return 1
            dl = abs(r["loss"] - c["loss"]) / abs(c["loss"])
            dg = abs(r["grad_norm"] - c["grad_norm"]) / abs(c["grad_norm"])
            worst = max(worst, dl)
            print(f"step {r['step']}: loss torch {r['loss']:.9f} cubelm {c['loss']:.9f} "
                  f"rel diff {dl:.2e} | gnorm torch {r['grad_norm']:.6f} cubelm "
                  f"{c['grad_norm']:.6f} rel diff {dg:.2e}")
            if not dl <= args.rtol:
                status = 1
        verdict = "agree" if status == 0 else "DISAGREE"
        print(f"{'PASS' if status == 0 else 'FAIL'}: losses {verdict} with {args.metrics}: "
              f"largest relative difference {worst:.2e} (tolerance {args.rtol:g})")
    if args.final:
        _, final = read_checkpoint(args.final)
        worst, worst_name, noise = 0.0, "", []
        for name, view in cubelm_tensors(model).items():
            mine = view.detach().to(torch.float64).cpu().numpy()
            start = arrays[name].astype(np.float64)
            theirs = final[name].astype(np.float64)
            if name.endswith("attn/bk"):
                # The key bias adds q.bk to every score of a row, which the softmax takes
                # away: its gradient is zero in exact arithmetic, and AdamW turns the
                # rounding noise of each implementation into steps of its own.
                noise.append(max(np.linalg.norm(mine - start), np.linalg.norm(theirs - start)))
                continue
            # The difference of the updates relative to cubelm's update, so that the
            # optimizer is compared and not only the end points.
            num = np.linalg.norm((mine - start) - (theirs - start))
            den = np.linalg.norm(theirs - start)
            rel = num / den if den > 0 else num
            if args.verbose:
                print(f"  {name}: update rel diff {rel:.2e} |update| {den:.2e}")
            if rel > worst:
                worst, worst_name = rel, name
        ok = worst <= args.update_rtol
        status = status or (0 if ok else 1)
        print(f"{'PASS' if ok else 'FAIL'}: parameters after the steps against {args.final}: "
              f"largest relative difference of a tensor's update {worst:.2e} ({worst_name}; "
              f"tolerance {args.update_rtol:g})")
        if noise:
            print(f"(left out: attn/bk, whose gradient is zero but for rounding; its largest "
                  f"update norm {max(noise):.1e})")
    return status


# -------------------------------------------------------------------- main --


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="PyTorch reference for cubelm's GPT-2: training-step speed (tokens/s, "
        "model FLOP rate, MFU) or agreement with a cubelm checkpoint and metrics file.")
    ap.add_argument("--model", choices=sorted(PRESETS),
                    help="a preset shape (perf/bench_train's): " + "; ".join(
                        f"{k}: L {v['layers']} H {v['hidden']} a {v['heads']} T {v['seq']} "
                        f"V {v['vocab']} B {v['batch']}" for k, v in PRESETS.items()))
    for key in ("layers", "hidden", "heads", "seq", "vocab"):
        ap.add_argument("--" + key, type=int, help=f"{key} (overrides the preset)")
    ap.add_argument("--batch", default=None,
                    help="micro-batch (sequences per step), or 'auto' on CUDA: the largest "
                    "power of two <= 64 that runs without running out of memory "
                    "(default: the preset's)")
    ap.add_argument("--vocab-divisible-by", type=int, default=128,
                    help="pad the vocabulary to a multiple of this (cubelm's "
                    "model.vocab_divisible_by; default 128)")
    ap.add_argument("--precision", default=None,
                    help="fp32, tf32, bf16 or a comma-separated list (default: all three; "
                    "with --check-against: fp32)")
    ap.add_argument("--compile", nargs="?", const="on", default="off",
                    choices=["off", "on", "both"],
                    help="torch.compile the model: --compile (on), --compile both, or off "
                    "(default); reported as skipped where torch has no torch.compile")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile's mode (default, reduce-overhead, max-autotune)")
    ap.add_argument("--qkv", choices=["fused", "separate"], default="fused",
                    help="one [3H, H] weight for q, k, v (default) or three [H, H]")
    ap.add_argument("--attention", choices=["auto", "sdpa", "manual"], default="auto",
                    help="sdpa: torch's fused scaled_dot_product_attention; manual: scores, "
                    "mask, softmax, product; auto: sdpa where torch has it")
    ap.add_argument("--device", default=None,
                    help="cuda or cpu (default: cuda when available; cpu with --check-against)")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps (default 10); with --check-against: steps to train "
                    "(default: the deck's train.steps less the checkpoint's step)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak for MFU, every precision (default on CUDA: the --gpu table by "
                    "precision; on the CPU none, MFU omitted)")
    ap.add_argument("--gpu", choices=sorted(PEAK_TFLOPS), default="h100",
                    help="the peak table: h100 = 989 bf16, 494 tf32, 67 fp32 dense TFLOP/s")
    ap.add_argument("--seed", type=int, default=1234, help="initialisation and data seed")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the shape, parameter count and FLOPs per token; run nothing")
    ap.add_argument("--json", help="write the figures to this file (a list of objects)")
    ap.add_argument("--check-against", metavar="FILE.h5",
                    help="start from this cubelm checkpoint and train its deck's steps")
    ap.add_argument("--data", help="with --check-against: the token file, in place of the "
                    "deck's data.path")
    ap.add_argument("--metrics", metavar="FILE.jsonl",
                    help="with --check-against: a cubelm metrics file to compare losses with")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="largest relative loss difference allowed (default 1e-4)")
    ap.add_argument("--final", metavar="FILE.h5",
                    help="with --check-against: cubelm's checkpoint after the same steps; "
                    "compares each tensor's update")
    ap.add_argument("--update-rtol", type=float, default=1e-3,
                    help="largest relative difference of a tensor's update (default 1e-3)")
    ap.add_argument("--verbose", action="store_true",
                    help="with --final: print every tensor's update difference")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64",
                    help="with --check-against: the reference's arithmetic (default float64)")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and not args.check_against else "cpu"
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("torch_gpt2: --device cuda: torch sees no CUDA device")
    if args.attention == "sdpa" and not has_sdpa():
        raise SystemExit(f"torch_gpt2: --attention sdpa: torch {torch.__version__} has no "
                         "scaled_dot_product_attention (torch 2.0 or later)")
    args.attention_impl = args.attention if args.attention != "auto" else (
        "sdpa" if has_sdpa() else "manual")
    args.steps_given = args.steps is not None
    if args.steps is None:
        args.steps = 10
    if args.batch not in (None, "auto"):
        try:
            if int(args.batch) < 1:
                raise ValueError
        except ValueError:
            raise SystemExit(f"torch_gpt2: --batch {args.batch}: a positive integer or auto")
    if args.check_against:
        return check(args)
    if args.steps < 1:
        raise SystemExit("torch_gpt2: --steps must be at least 1")
    return speed(args)


if __name__ == "__main__":
    sys.exit(main())
