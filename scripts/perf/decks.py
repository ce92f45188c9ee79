"""The campaign decks: every tensor-parallel mode at every rank count, for
GPT-2-shaped models and two small ones (docs/perf-runs.md).

    scripts/perf-decks [-o DIR]

writes DIR/<model>/<set>/<mode>-<ranks>.toml (default DIR: inputs/perf) and
DIR/README.md, the index of the decks and of the (mode, ranks) pairs that no
layout fits, with the reason. The decks in inputs/perf are this program's
output; a test checks that they are up to date.

Layout rule: the largest tensor-parallel group the mode allows that divides
the rank count and fits the model; the other ranks are data-parallel
replicas. Strong-scaling sets keep the global batch; weak-scaling sets keep
the sequences per rank. The micro-batch is the largest multiple of the mode's
unit (1D: 1 sequence, 2D: q, 3D: q^2) that divides a replica's share and is at
most the set's micro-batch target; the rest is gradient accumulation.
"""

import argparse
import os

from common import deck_text, main_guard

MODELS = {
    # name: (description, [model] keys)
    "gpt2-124m": ("GPT-2 124M-shaped", dict(vocab_size=50257, seq_len=1024, hidden=768, heads=12, layers=12)),
    "gpt2-350m": ("GPT-2 350M-shaped", dict(vocab_size=50257, seq_len=1024, hidden=1024, heads=16, layers=24)),
    "gpt2-1.3b": ("GPT-2 1.3B-shaped (hidden 2048, 16 heads of 128, 24 layers)",
                  dict(vocab_size=50257, seq_len=1024, hidden=2048, heads=16, layers=24)),
    "tiny": ("tiny", dict(vocab_size=256, seq_len=32, hidden=64, heads=8, layers=2)),
    "small": ("small (perf/bench_train's small model)",
              dict(vocab_size=8192, seq_len=128, hidden=256, heads=8, layers=4)),
    "small-moe": ("small MoE (the small model, every MLP an MoE of 8 experts, top 2)",
                  dict(vocab_size=8192, seq_len=128, hidden=256, heads=8, layers=4, experts=8,
                       top_k=2)),
}

GPT2_RANKS = [4, 8, 16, 27, 64]
GPT2_TRAIN = dict(steps=30, seed=1234)
GPT2_OPTIMIZER = dict(lr=6e-4, min_lr=6e-5, warmup_steps=10)
GPT2_LOG = dict(interval=10, metrics="metrics.jsonl")

# set name: (models, rank counts, global batch as a function of ranks, micro-batch target, ...)
SETS = {
    "strong": dict(models=["gpt2-124m", "gpt2-350m", "gpt2-1.3b"], ranks=GPT2_RANKS,
                   batch=lambda ranks: 64, micro=16, train=GPT2_TRAIN, optimizer=GPT2_OPTIMIZER,
                   log=GPT2_LOG,
                   text="strong scaling: 64 sequences per step at every rank count"),
    "weak": dict(models=["gpt2-124m", "gpt2-350m", "gpt2-1.3b"], ranks=GPT2_RANKS,
                 batch=lambda ranks: 4 * ranks, micro=16, train=GPT2_TRAIN, optimizer=GPT2_OPTIMIZER,
                 log=GPT2_LOG,
                 text="weak scaling: 4 sequences per rank and step"),
    "suite": dict(models=["tiny"], ranks=[1, 2, 4, 8], batch=lambda ranks: 16, micro=16,
                  train=dict(steps=12, seed=1234), optimizer=dict(lr=3e-3, min_lr=3e-4, warmup_steps=2),
                  log=dict(interval=4, metrics="metrics.jsonl"),
                  data=dict(synthetic_tokens=65536),
                  text="the small campaign of the test suite: 16 sequences per step at 1-8 ranks"),
    "workstation": dict(models=["tiny", "small"], ranks=[1, 2, 4, 8], batch=lambda ranks: 16,
                        micro=16, train=dict(steps=20, seed=1234),
                        optimizer=dict(lr=3e-3, min_lr=3e-4, warmup_steps=2),
                        log=dict(interval=5, metrics="metrics.jsonl"),
                        data=dict(synthetic_tokens=262144),
                        text="a campaign for one workstation or node: 16 sequences per step at "
                             "1-8 ranks, 20 steps"),
    "moe-workstation": dict(models=["small-moe"], ranks=[1, 2, 4, 8], batch=lambda ranks: 16,
                            micro=16, train=dict(steps=20, seed=1234),
                            optimizer=dict(lr=3e-3, min_lr=3e-4, warmup_steps=2),
                            log=dict(interval=5, metrics="metrics.jsonl"),
                            data=dict(synthetic_tokens=262144),
                            text="the workstation campaign of an MoE model: 16 sequences per step "
                                 "at 1-8 ranks, 20 steps, the tensor ranks folded into expert "
                                 "parallelism (expert_size = tensor_size)"),
}

MODE_NAMES = {"none": "no tensor parallelism", "1d": "1D (Megatron) tensor parallelism",
              "1d+sp": "1D tensor parallelism with sequence parallelism",
              "2d": "2D (SUMMA) tensor parallelism", "3d": "3D (cube) tensor parallelism"}
MODES = ["1d", "1d+sp", "2d", "3d"]


def file_stem(mode, ranks):
    return f"{mode.replace('+', '')}-{ranks}"


def tensor_sizes(mode, ranks):
    """Tensor sizes > 1 the mode allows that divide ranks, largest first, as (size, q)."""
    sizes = []
    for q in range(ranks, 1, -1):
        t = {"1d": q, "1d+sp": q, "2d": q * q, "3d": q * q * q}[mode]
        if t <= ranks and ranks % t == 0:
            sizes.append((t, q))
    return sorted(sizes, reverse=True)


def model_misfit(mode, t, q, m):
    """Why the model cannot be split this way (the rules of docs/training.md), or None."""
    H, a = m["hidden"], m["heads"]
    if m.get("experts", 0) > 1 and m["experts"] % t:
        return f"experts {m['experts']} % {t} != 0 (one expert group over the tensor ranks)"
    if mode in ("1d", "1d+sp"):
        if a % t:
            return f"heads {a} % {t} != 0"
        if 4 * H % t:
            return f"4*hidden {4 * H} % {t} != 0"
        return None
    if a % q:
        return f"heads {a} % {q} != 0"
    if H % (q * q):
        return f"hidden {H} % {q * q} != 0"
    return None


def choose_layout(mode, ranks, m, batch, micro_target):
    """(parallel section, None) for the best layout, or (None, reason)."""
    reasons = []
    for t, q in tensor_sizes(mode, ranks):
        why = model_misfit(mode, t, q, m)
        if why:
            reasons.append(f"tensor size {t}: {why}")
            continue
        d = ranks // t
        if batch % d:
            reasons.append(f"tensor size {t}: global batch {batch} % data size {d} != 0")
            continue
        share = batch // d
        unit = {"1d": 1, "1d+sp": 1, "2d": q, "3d": q * q}[mode]
        micro = max((b for b in range(unit, min(share, micro_target) + 1, unit) if share % b == 0),
                    default=0)
        if mode == "1d+sp":  # the rows of a micro-batch are split over the tensor group
            micro = max((b for b in range(1, min(share, micro_target) + 1)
                         if share % b == 0 and b * m["seq_len"] % t == 0), default=0)
        if micro == 0:
            reasons.append(f"tensor size {t}: no micro-batch of a multiple of {unit} sequences "
                           f"{'and of tokens divisible by ' + str(t) + ' ' if mode == '1d+sp' else ''}"
                           f"divides the {share} sequences of a replica")
            continue
        p = {"tensor_mode": mode.replace("+sp", ""), "tensor_size": t}
        if mode == "1d+sp":
            p["sequence_parallel"] = True
        if m.get("experts", 0) > 1:  # the MoE layers fold the tensor ranks into ep
            p["expert_size"] = t
        if d > 1:
            p["data_size"] = d
        if share // micro > 1:
            p["microbatches"] = share // micro
        return p, None
    if not reasons:
        shape = {"2d": "square q*q", "3d": "cube q*q*q"}.get(mode, "divisor")
        return None, f"no {shape} > 1 divides {ranks}"
    return None, "; ".join(reasons)


def layout_words(p, ranks):
    words = f"tp {p['tensor_mode']}{'+sp' if p.get('sequence_parallel') else ''}:{p['tensor_size']}"
    if p.get("data_size", 1) > 1:
        words += f" x dp {p['data_size']}"
    if p.get("microbatches", 1) > 1:
        words += f", {p['microbatches']} micro-batches"
    if p.get("expert_size", 1) > 1:
        words += f"; MoE layers ep {p['expert_size']}"
    return words


def make_deck(model_name, set_name, mode, ranks):
    """(stem, deck dict, header text) or (stem, None, reason)."""
    desc, m = MODELS[model_name]
    m = dict(m)
    s = SETS[set_name]
    batch = s["batch"](ranks)
    if mode == "none":
        p = {"tensor_mode": "none"}
        if ranks > 1:
            return file_stem(mode, ranks), None, "one rank only"
        if batch > s["micro"]:
            p["microbatches"] = batch // s["micro"]
    else:
        p, why = choose_layout(mode, ranks, m, batch, s["micro"])
        if p is None:
            return file_stem(mode, ranks), None, why
    deck = {
        "model": m,
        "parallel": p,
        "train": dict(s["train"], global_batch=batch),
        "optimizer": dict(s["optimizer"]),
        "data": dict(format="synthetic", **s.get("data", {})),
        "checkpoint": dict(dir="checkpoints", keep=1, resume="auto"),
        "log": dict(s["log"]),
    }
    header = (f"{desc} model, {MODE_NAMES[mode]} on {ranks} rank{'s' if ranks > 1 else ''}"
              f"{': ' + layout_words(p, ranks) if mode != 'none' else ''}.\n"
              f"Campaign set '{set_name}': {s['text']}, sequences of {m['seq_len']} tokens.\n"
              "Written by scripts/perf-decks; run a whole set with scripts/sweep (docs/perf-runs.md).")
    return file_stem(mode, ranks), deck, header


def generate(out):
    """Writes every deck and the index under out; returns the number of decks."""
    index = ["# Campaign decks", "",
             "Written by `scripts/perf-decks` (do not edit by hand); how to run them:",
             "[docs/perf-runs.md](../../docs/perf-runs.md). Each set is one directory; each deck",
             "is `<mode>-<ranks>.toml`. Layout rule: the largest tensor-parallel group the mode",
             "allows that divides the rank count and fits the model, the other ranks data-parallel;",
             "the micro-batch is the largest multiple of the mode's unit (1D: 1, 2D: q, 3D: q²",
             "sequences) that divides a replica's share, at most 16 sequences.", ""]
    count = 0
    for set_name, s in SETS.items():
        for model_name in s["models"]:
            desc, m = MODELS[model_name]
            folder = os.path.join(out, model_name, set_name)
            os.makedirs(folder, exist_ok=True)
            index += [f"## {model_name}/{set_name}", "",
                      f"{desc}: {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads, "
                      f"context {m['seq_len']}, vocabulary {m['vocab_size']} (padded to the layout by "
                      f"model.vocab_divisible_by); {s['text']}.", "",
                      "| ranks | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
            misfits = []
            for ranks in s["ranks"]:
                modes = ["none"] if ranks == 1 else MODES
                cells = []
                for mode in modes:
                    stem, deck, header = make_deck(model_name, set_name, mode, ranks)
                    if deck is None:
                        cells.append("—")
                        misfits.append(f"- {mode} at {ranks} ranks: {header}")
                        continue
                    with open(os.path.join(folder, stem + ".toml"), "w") as f:
                        f.write(deck_text(deck, header))
                    count += 1
                    words = layout_words(deck["parallel"], ranks) if mode != "none" else "1 rank"
                    cells.append(f"`{stem}`: {words}")
                if ranks == 1:
                    cells += [""] * (len(MODES) - 1)
                index.append(f"| {ranks} | " + " | ".join(cells) + " |")
            index.append("")
            if misfits:
                index += ["No layout fits:", ""] + misfits + [""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(index))
    return count


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(prog="scripts/perf-decks", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", dest="out", default=os.path.join(here, "..", "..", "inputs", "perf"),
                        help="directory to write (default: inputs/perf)")
    args = parser.parse_args()
    n = generate(os.path.normpath(args.out))
    print(f"scripts/perf-decks: {n} decks and README.md in {os.path.normpath(args.out)}")
    return 0


if __name__ == "__main__":
    main_guard("scripts/perf-decks", main)
