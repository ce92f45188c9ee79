"""The report of a campaign: tables and plots of its runs, by model.

    scripts/report RUN_DIR... -o OUT_DIR [--warmup N] [--skip-bad]

RUN_DIR is a run directory (deck.toml, metrics.jsonl, and check.json and
run.json when scripts/sweep made it) or a campaign directory holding run
directories. Writes OUT_DIR/report.md, OUT_DIR/report.csv (one row per run,
full precision) and, for each model of each campaign, four PNG plots of
1000 x 600 pixels: step time and its split, bytes per rank, memory per rank and
the loss curves. docs/perf-runs.md says how to read them.

Step statistics leave out the first N steps (--warmup, default 1: the first
step also touches every buffer and opens the connections) and steps skipped
as non-finite: step time is rank 0's wall-clock time per step (`ms`), median
and 90th percentile (linear interpolation); compute, exposed communication
(`comm_ms`, all groups) and idle (pipeline) are means over steps of the means
over ranks, their shares relative to the mean over steps of `step_ms.mean`;
bytes per rank is the median over steps of `comm_bytes` (rank 0's modelled
bytes), beside the closed form of `cubelm check --json`; memory is rank 0's
allocation (`mem_bytes`) beside the estimate for the fullest rank; MFU and
tokens/s are medians; the final loss is the loss of the last step.

Runs of one deck repeated (scripts/sweep --repeat) are one point of the tables
and plots: each number the median over the repeats of the runs' own numbers,
with the lowest and highest beside step time and tokens/s and as the step-time
plot's bars; report.csv keeps one row per run (with its point and repeat).
"""

import argparse
import csv
import json
import math
import os
import re
import sys

from common import MODES, UserError, load_deck, main_guard, mode_of, model_text, read_json, world_of

try:
    import numpy as np
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
except ImportError as e:
    sys.exit(f"scripts/report: {e}: install the Debian packages python3-numpy and python3-matplotlib "
             "(scripts/setup does)")

FIGSIZE, DPI = (10, 6), 100  # 1000 x 600 pixels
COLORS = {"none": "black", "1d": "tab:blue", "1d+sp": "tab:orange", "2d": "tab:green", "3d": "tab:red"}
# Bytes a rank sends per step against the tensor-parallel size p, up to a constant, from the
# closed forms of docs/communication.md (their terms in N H and H^2; the small LayerNorm, bias and
# cross-entropy terms left out): 1D's all-reduces cost 2 (p-1)/p, independent of p for large p;
# 2D's broadcasts and reductions (q-1)/q^2 = p^-1/2 for large p; 3D's gathers and reductions
# (q-1)/q^3 = p^-2/3.
THEORY_CURVES = {
    "1d": (lambda p: (p - 1) / p, "(p−1)/p → p^0"),
    "1d+sp": (lambda p: (p - 1) / p, "(p−1)/p → p^0"),
    "2d": (lambda p: (np.sqrt(p) - 1) / p, "(q−1)/q² → p^-1/2"),
    "3d": (lambda p: (np.cbrt(p) - 1) / p, "(q−1)/q³ → p^-2/3"),
}
SPREAD_KEYS = ("compute_ms", "idle_ms", "step_ms")
NUMBER_KEYS = ("step", "ms", "tokens_per_s", "mfu", "mem_bytes", "comm_bytes")
CSV_COLUMNS = ["campaign", "model", "mode", "ranks", "layout", "global_batch", "steps", "steps_measured",
               "step_ms_median", "step_ms_p90", "step_ms_mean", "compute_ms", "comm_ms", "idle_ms",
               "comm_bytes", "comm_bytes_closed_form", "mem_bytes", "mem_bytes_estimate", "mfu",
               "tokens_per_s", "final_loss", "status", "run_dir", "point", "repeat"]


class Run:
    """One run directory, read and checked."""

    def __init__(self, path, warmup):
        self.dir = path
        deck_path = os.path.join(path, "deck.toml")
        metrics_path = os.path.join(path, "metrics.jsonl")
        for f in (deck_path, metrics_path):
            if not os.path.isfile(f):
                raise UserError(f"{path}: not a run directory: {os.path.basename(f)} is missing "
                                "(a run directory holds deck.toml and metrics.jsonl; scripts/sweep makes them)")
        self.deck = load_deck(deck_path)
        self.mode = mode_of(self.deck, deck_path)
        self.ranks = world_of(self.deck)
        self.model = model_text(self.deck)
        self.global_batch = int(self.deck.get("train", {}).get("global_batch", 8))
        info = read_json(os.path.join(path, "run.json")) if os.path.isfile(os.path.join(path, "run.json")) else {}
        self.name = info.get("name", os.path.basename(os.path.normpath(path)))
        # scripts/sweep --repeat: the repeats of one deck form one point of the report.
        self.point = info.get("point", self.name)
        self.repeat = int(info.get("repeat", 1))
        self.campaign = info.get("campaign", os.path.basename(os.path.dirname(os.path.abspath(path))))
        self.status = info.get("status", "unknown")
        self.layout = info.get("layout") or self.mode
        self.tensor_size = int(self.deck.get("parallel", {}).get("tensor_size", 1))
        check_path = os.path.join(path, "check.json")
        self.check = read_json(check_path) if os.path.isfile(check_path) else None
        if self.check is not None:
            for key in ("comm_bytes", "mem_bytes", "world"):
                if not isinstance(self.check.get(key), (int, float)):
                    raise UserError(f"{check_path}: no number '{key}' (it should be the output of "
                                    "`cubelm check deck.toml --json`)")
            if self.check["world"] != self.ranks:
                raise UserError(f"{check_path}: world {self.check['world']} but deck.toml's layout has "
                                f"{self.ranks} rank{'s' if self.ranks != 1 else ''}: check.json belongs to another deck")
        self.steps = read_metrics(metrics_path)
        self.measured = [s for s in self.steps if s["step"] >= warmup and not s.get("skipped")]
        if not self.measured:
            raise UserError(f"{metrics_path}: {len(self.steps)} step(s), none after the warm-up "
                            f"(--warmup {warmup}) that was not skipped: nothing to measure")
        self.stats = self.compute_stats()

    def compute_stats(self):
        m = self.measured
        ms = np.array([s["ms"] for s in m], dtype=float)
        comm = np.array([sum(g["mean"] for g in s["comm_ms"].values()) for s in m], dtype=float)
        last = max(self.steps, key=lambda s: s["step"])
        return {
            "steps": len(self.steps),
            "steps_measured": len(m),
            "step_ms_median": float(np.median(ms)),
            "step_ms_p90": float(np.percentile(ms, 90)),
            "step_ms_mean": float(np.mean([s["step_ms"]["mean"] for s in m])),
            "compute_ms": float(np.mean([s["compute_ms"]["mean"] for s in m])),
            "comm_ms": float(np.mean(comm)),
            "idle_ms": float(np.mean([s["idle_ms"]["mean"] for s in m])),
            "comm_bytes": float(np.median([s["comm_bytes"] for s in m])),
            "comm_bytes_closed_form": float(self.check["comm_bytes"]) if self.check else math.nan,
            "mem_bytes": float(max(s["mem_bytes"] for s in m)),
            "mem_bytes_estimate": float(self.check["mem_bytes"]) if self.check else math.nan,
            # MFU above 1 means the run measured its peak below its own rate (cubelm
            # before the peak was measured alone on the node): no MFU at all, then.
            "mfu": (float(np.median([s["mfu"] for s in m])) if max(s["mfu"] for s in m) <= 1.0
                    else math.nan),
            "tokens_per_s": float(np.median([s["tokens_per_s"] for s in m])),
            "final_loss": float(last["loss"]) if last["loss"] is not None else math.nan,
        }


class Point:
    """The repeats of one deck (scripts/sweep --repeat): each number the median over the
    repeats of the runs' own values, with the lowest and highest beside it. A point of one
    run is that run."""

    def __init__(self, runs):
        runs = sorted(runs, key=lambda r: r.repeat)
        self.runs = runs
        first = runs[0]
        for key in ("mode", "ranks", "layout", "model", "global_batch", "tensor_size", "campaign"):
            setattr(self, key, getattr(first, key))
        self.name = first.point
        self.repeats = len(runs)
        self.steps = first.steps  # the loss curve of the first repeat
        self.status = first.status if all(r.status == first.status for r in runs) else \
            ", ".join(f"r{r.repeat} {r.status}" for r in runs)
        self.stats, self.low, self.high = {}, {}, {}
        for key in first.stats:
            values = [r.stats[key] for r in runs]
            finite = [v for v in values if not math.isnan(v)]
            self.stats[key] = float(np.median(finite)) if finite else math.nan
            self.low[key] = min(finite) if finite else math.nan
            self.high[key] = max(finite) if finite else math.nan


def points_of(runs):
    """Runs grouped by their deck's point, in the runs' order."""
    by = {}
    for r in runs:
        by.setdefault(r.point, []).append(r)
    return [Point(rs) for rs in by.values()]


def read_metrics(path):
    """The steps of a metrics file, each checked for the keys the report reads."""
    steps, seen = [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                s = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
            if not isinstance(s, dict):
                raise UserError(f"{where}: not a JSON object")
            for key in NUMBER_KEYS:
                if not isinstance(s.get(key), (int, float)) or isinstance(s.get(key), bool):
                    raise UserError(f"{where}: '{key}' is {'missing' if key not in s else repr(s[key])}, "
                                    "expected a number (cubelm train's log.metrics lines)")
            if "loss" not in s or not (s["loss"] is None or isinstance(s["loss"], (int, float))):
                raise UserError(f"{where}: 'loss' is missing or not a number")
            for key in SPREAD_KEYS:
                spread = s.get(key)
                if not (isinstance(spread, dict) and all(isinstance(spread.get(k), (int, float))
                                                         for k in ("mean", "max"))):
                    raise UserError(f"{where}: '{key}' is missing or not {{\"mean\": x, \"max\": y}} "
                                    "(metrics of a cubelm without the time split of docs/perf-runs.md?)")
            comm = s.get("comm_ms")
            if not (isinstance(comm, dict) and all(isinstance(g, dict) and isinstance(g.get("mean"), (int, float))
                                                   for g in comm.values())):
                raise UserError(f"{where}: 'comm_ms' is missing or not an object of {{\"mean\": x, \"max\": y}} by group")
            if s["step"] in seen:
                raise UserError(f"{where}: step {s['step']} again (first on line {seen[s['step']]})")
            seen[s["step"]] = n
            steps.append(s)
    if not steps:
        raise UserError(f"{path}: no steps (the file is empty: did the run start?)")
    return sorted(steps, key=lambda s: s["step"])


def find_runs(paths):
    """Run directories named by paths: each a run directory or a directory of them."""
    found = []
    for p in paths:
        if not os.path.isdir(p):
            raise UserError(f"{p}: no such directory")
        if os.path.isfile(os.path.join(p, "deck.toml")) or os.path.isfile(os.path.join(p, "metrics.jsonl")):
            found.append(p)
            continue
        subs = sorted(os.path.join(p, d) for d in os.listdir(p)
                      if os.path.isfile(os.path.join(p, d, "deck.toml")))
        if not subs:
            raise UserError(f"{p}: neither a run directory (deck.toml, metrics.jsonl) nor a campaign "
                            "directory holding run directories")
        found += subs
    return found


# ------------------------------------------------------------------ tables --
def fmt_split(ms, step):
    return f"{ms:.2f} ({100.0 * ms / step:.0f}%)" if step > 0 else f"{ms:.2f}"


def fmt(x, spec):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(runs):
    head = ["mode", "ranks", "layout", "step ms median", "step ms p90", "compute ms (share)",
            "exposed comm ms (share)", "idle ms (share)", "MB/rank/step measured", "MB/rank/step closed form",
            "MiB/rank measured", "MiB/rank estimate", "MFU %", "tokens/s", "final loss"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        s = r.stats
        spread = (lambda key, spec: f" [{format(r.low[key], spec)}-{format(r.high[key], spec)}]"
                  if getattr(r, "repeats", 1) > 1 else "")
        cells = [r.mode, str(r.ranks), r.layout, f"{s['step_ms_median']:.2f}" + spread("step_ms_median", ".2f"),
                 f"{s['step_ms_p90']:.2f}",
                 fmt_split(s["compute_ms"], s["step_ms_mean"]), fmt_split(s["comm_ms"], s["step_ms_mean"]),
                 fmt_split(s["idle_ms"], s["step_ms_mean"]),
                 f"{s['comm_bytes'] / 1e6:.3f}", fmt(s["comm_bytes_closed_form"] / 1e6, ".3f"),
                 f"{s['mem_bytes'] / 2**20:.2f}", fmt(s["mem_bytes_estimate"] / 2**20, ".2f"),
                 fmt(100 * s["mfu"], ".2f"), f"{s['tokens_per_s']:.0f}" + spread("tokens_per_s", ".0f"),
                 fmt(s["final_loss"], ".4f")]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def loss_agreement(runs):
    """Lines saying how far each run's losses are from the first run's of the same global batch."""
    lines = []
    by_batch = {}
    for r in runs:
        by_batch.setdefault(r.global_batch, []).append(r)
    for batch, rs in sorted(by_batch.items()):
        ref = min(rs, key=lambda r: (r.ranks, MODES.index(r.mode)))
        ref_loss = {s["step"]: s["loss"] for s in ref.steps if s["loss"] is not None}
        worst, where = 0.0, None
        for r in rs:
            for s in r.steps:
                if s["loss"] is not None and s["step"] in ref_loss:
                    d = abs(s["loss"] - ref_loss[s["step"]])
                    if d > worst:
                        worst, where = d, (r, s["step"])
        text = (f"global batch {batch}: {len(rs)} run(s) against {ref.mode} at {ref.ranks} rank(s): largest "
                f"loss difference {worst:.3g}")
        lines.append(text + (f" ({where[0].mode} at {where[0].ranks} ranks, step {where[1]})" if where else ""))
    return lines


# ------------------------------------------------------------------- plots --
def slug(text):
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def rank_axis(ax, runs, log_y=False):
    ax.set_xscale("log", base=2)
    ticks = sorted({r.ranks for r in runs})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off() if not log_y else None
    ax.set_xlabel("ranks")
    ax.grid(True, which="major", alpha=0.3)


def plain_log_axis(axis):
    """Tick labels of a log axis as plain numbers (1.5, 20, 300), not powers of ten."""
    text = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(text)
    axis.set_minor_formatter(text)
    for label in axis.get_minorticklabels():
        label.set_fontsize(7)


def by_mode(runs):
    out = {}
    for r in runs:
        out.setdefault(r.mode, []).append(r)
    return [(m, sorted(out[m], key=lambda r: r.ranks)) for m in MODES if m in out]


def plot_step_time(runs, title, path):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax1 = fig.add_axes([0.07, 0.12, 0.36, 0.76])
    ax2 = fig.add_axes([0.51, 0.22, 0.47, 0.66])
    for mode, rs in by_mode(runs):
        x = [r.ranks for r in rs]
        med = np.array([r.stats["step_ms_median"] for r in rs])
        if max(getattr(r, "repeats", 1) for r in rs) > 1:  # the spread of the repeats' medians
            err = [med - np.array([r.low["step_ms_median"] for r in rs]),
                   np.array([r.high["step_ms_median"] for r in rs]) - med]
        else:  # one run: its own 90th percentile
            err = [np.zeros_like(med), np.array([r.stats["step_ms_p90"] for r in rs]) - med]
        ax1.errorbar(x, med, yerr=err, marker="o", capsize=3, color=COLORS[mode], label=mode)
    rank_axis(ax1, runs)
    ax1.set_ylim(bottom=0)
    repeated = max(getattr(r, "repeats", 1) for r in runs) > 1
    ax1.set_ylabel("step time, ms: median over repeats of the runs' medians; bar: lowest to highest"
                   if repeated else "step time, ms (median; bar to the 90th percentile)", fontsize=8 if repeated else None)
    ax1.legend(title="mode")
    ax1.set_title("step time")
    order = sorted(runs, key=lambda r: (r.ranks, MODES.index(r.mode)))
    labels = [f"{r.mode}\n{r.ranks}" for r in order]
    x = np.arange(len(order))
    bottom = np.zeros(len(order))
    for key, name, color in (("compute_ms", "compute", "tab:gray"), ("comm_ms", "exposed communication", "tab:purple"),
                             ("idle_ms", "idle (pipeline)", "tab:olive")):
        v = np.array([r.stats[key] for r in order])
        ax2.bar(x, v, bottom=bottom, color=color, label=name)
        bottom += v
    ax2.plot(x, [r.stats["step_ms_mean"] for r in order], "k_", markersize=14, label="step (mean over ranks)")
    ax2.set_ylim(0, 1.3 * max(bottom.max(), max(r.stats["step_ms_mean"] for r in order)))
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, fontsize=8)
    ax2.set_xlabel("mode, ranks")
    ax2.set_ylabel("ms per step, mean over ranks")
    ax2.legend(fontsize=8)
    ax2.set_title("where the time goes")
    fig.suptitle(title)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_bytes(runs, title, path):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_axes([0.09, 0.1, 0.6, 0.8])
    left_out = [r for r in runs if r.stats["comm_bytes"] <= 0]
    for mode, rs in by_mode([r for r in runs if r.stats["comm_bytes"] > 0]):
        x = np.array([r.ranks for r in rs], dtype=float)
        y = np.array([r.stats["comm_bytes"] for r in rs]) / 1e6
        c = COLORS[mode]
        ax.plot(x, y, "o-", color=c, label=f"{mode} measured")
        for r, xi, yi in zip(rs, x, y):
            if r.ranks != r.tensor_size:  # data or pipeline parallelism beside the tensor group
                ax.annotate(r.layout.replace(f"tp {mode}:", "tp "), (xi, yi), textcoords="offset points",
                            xytext=(6, -12), fontsize=7, color=c)
        closed = np.array([r.stats["comm_bytes_closed_form"] for r in rs]) / 1e6
        if np.isfinite(closed).any():
            ax.plot(x, closed, "s--", color=c, markerfacecolor="none", markersize=9, label=f"{mode} closed form")
        # The theory for runs that are tensor parallel alone, through the first of them.
        pure = [(r.ranks, r.stats["comm_bytes"] / 1e6) for r in rs if r.ranks == r.tensor_size]
        if mode in THEORY_CURVES and len(pure) > 1:
            f, text = THEORY_CURVES[mode]
            xs = np.geomspace(pure[0][0], pure[-1][0], 50)
            ax.plot(xs, pure[0][1] * f(xs) / f(pure[0][0]), ":", color=c, linewidth=2,
                    label=f"{mode} theory ∝ {text}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({r.ranks for r in runs if r.stats["comm_bytes"] > 0})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    plain_log_axis(ax.yaxis)
    ax.set_xlabel("ranks")
    ax.set_ylabel("MB sent per rank per step (rank 0, modelled)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    note = "theory: the closed forms' leading terms, for the runs without data parallelism"
    if left_out:
        note += "; left out (no traffic): " + ", ".join(f"{r.mode} at {r.ranks}" for r in left_out)
    ax.set_title(note, fontsize=9)
    fig.suptitle(title)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_memory(runs, title, path):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_axes([0.09, 0.1, 0.6, 0.8])
    for mode, rs in by_mode(runs):
        x = np.array([r.ranks for r in rs], dtype=float)
        c = COLORS[mode]
        ax.plot(x, [r.stats["mem_bytes"] / 2**20 for r in rs], "o-", color=c, label=f"{mode} rank 0, allocated")
        est = np.array([r.stats["mem_bytes_estimate"] for r in rs]) / 2**20
        if np.isfinite(est).any():
            ax.plot(x, est, "s--", color=c, markerfacecolor="none", markersize=9, label=f"{mode} fullest rank, estimate")
    first = min(runs, key=lambda r: r.ranks)
    xs = np.array(sorted({r.ranks for r in runs}), dtype=float)
    if len(xs) > 1:
        ax.plot(xs, first.stats["mem_bytes"] / 2**20 * xs[0] / xs, ":", color="gray", linewidth=2,
                label="∝ 1/p (everything split)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(int(t)) for t in xs])
    plain_log_axis(ax.yaxis)
    ax.set_xlabel("ranks")
    ax.set_ylabel("MiB per rank (parameters, gradients, AdamW, activations)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_loss(runs, title, path, agreement):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_axes([0.08, 0.1, 0.62, 0.8])
    markers = ["o", "s", "^", "v", "D", "P", "X", "*", "<", ">"]
    n = len(runs)
    i = 0
    for mode, rs in by_mode(runs):
        for j, r in enumerate(rs):
            pts = [(s["step"], s["loss"]) for s in r.steps if s["loss"] is not None]
            # Curves that agree lie on top of each other: the first ones drawn wider, and each
            # run marks every n-th step from its own, so that every run shows on the common curve.
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker=markers[j % len(markers)],
                    markevery=(i % max(len(pts), 1), n), markersize=8, color=COLORS[mode],
                    linewidth=1.0 + 3.0 * (n - 1 - i) / max(n - 1, 1),
                    label=f"{mode} at {r.ranks} (batch {r.global_batch})")
            i += 1
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title("\n".join(agreement), fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# -------------------------------------------------------------------- main --
THEORY = """## What the modes should show

Per rank and step, for p ranks in the tensor-parallel group (q = √p in 2D, ∛p in 3D),
N tokens of a micro-batch, H the hidden size, L layers (closed forms:
docs/communication.md and docs/tensor-parallel.md; docs/perf-runs.md explains):

| mode | elements sent per rank and micro-batch (× 4 bytes), leading terms | weights per rank | activations per rank |
|---|---|---|---|
| 1D | 2 (p−1)/p (4L + 2) N H: independent of p | ∝ 1/p | residual stream replicated, inside of the pairs ∝ 1/p |
| 1D + SP | as 1D (reduce-scatter + all-gather instead of all-reduce) | ∝ 1/p | residual stream ∝ 1/p, LayerNorm outputs replicated |
| 2D | (q−1)/q² (21 L N H + 36 L H²): ∝ p^-1/2 | ∝ 1/q² = 1/p | ∝ 1/q² = 1/p |
| 3D | (q−1)/q³ (39 L N H + 36 L H²): ∝ p^-2/3 | ∝ 1/q³ = 1/p | ∝ 1/q³ = 1/p |

Runs whose layout adds data parallelism (dp > 1) also send the gradient reduction
(2 (d−1)/d · 4 bytes per parameter of the rank) and do not follow the tensor-parallel
curves alone. All layouts train the same model on the same data: runs of the same
global batch must have the same loss curve, up to float summation order.
"""


def main():
    parser = argparse.ArgumentParser(prog="scripts/report", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("-o", dest="out", required=True, metavar="OUT_DIR")
    parser.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="leave the first N steps out of the step statistics (default 1)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="leave out run directories that cannot be read, naming them, instead of stopping")
    args = parser.parse_args()
    if args.warmup < 0:
        raise UserError(f"--warmup {args.warmup}: at least 0")
    runs, bad = [], []
    for d in find_runs(args.runs):
        try:
            runs.append(Run(d, args.warmup))
        except UserError as e:
            if not args.skip_bad:
                raise
            bad.append(str(e))
    if not runs:
        raise UserError("no run to report" + (": " + "; ".join(bad) if bad else ""))
    os.makedirs(args.out, exist_ok=True)

    groups = {}
    for r in runs:
        groups.setdefault((r.campaign, r.model), []).append(r)
    md = ["# cubelm perf report", "",
          f"{len(runs)} run(s) from {', '.join(sorted(set(args.runs)))}. Step statistics over the steps after "
          f"the first {args.warmup} (warm-up); definitions in docs/perf-runs.md.", ""]
    if bad:
        md += ["Left out:", ""] + [f"- {b}" for b in bad] + [""]
    rows = []
    for (campaign, model), runs_of_model in sorted(groups.items()):
        rs = points_of(runs_of_model)
        rs.sort(key=lambda r: (MODES.index(r.mode), r.ranks, r.name))
        repeats = sorted({r.repeats for r in rs})
        title = f"{campaign}: {model}" + (f", {'/'.join(map(str, repeats))} repeats" if repeats != [1] else "")
        base = slug(f"{campaign}-{model}")
        agreement = loss_agreement(rs)
        files = {k: f"{base}-{k}.png" for k in ("step-time", "bytes", "memory", "loss")}
        plot_step_time(rs, title, os.path.join(args.out, files["step-time"]))
        plot_bytes(rs, title, os.path.join(args.out, files["bytes"]))
        plot_memory(rs, title, os.path.join(args.out, files["memory"]))
        plot_loss(rs, title, os.path.join(args.out, files["loss"]), agreement)
        batches = sorted({r.global_batch for r in rs})
        md += [f"## {title}", "",
               f"Global batch {', '.join(map(str, batches))} sequences; {len(runs_of_model)} run(s)"
               + (f" of {len(rs)} deck(s), repeated: each number is the median over a deck's repeats of "
                  "its runs' values, [lowest-highest] beside step time and tokens/s." if repeats != [1] else "."), ""]
        md += table(rs)
        incomplete = [r for r in rs if r.status not in ("ok", "unknown")]
        if incomplete:
            md += ["", "Not complete (run.json): " + ", ".join(f"{r.name} ({r.status})" for r in incomplete)]
        md += ["", "Loss curves: " + "; ".join(agreement) + ".", ""]
        md += [f"![step time and its split]({files['step-time']})", "",
               f"![bytes per rank per step]({files['bytes']})", "",
               f"![memory per rank]({files['memory']})", "",
               f"![loss curves]({files['loss']})", ""]
        for r in sorted(runs_of_model, key=lambda r: (MODES.index(r.mode), r.ranks, r.name)):
            row = dict(campaign=campaign, model=model, mode=r.mode, ranks=r.ranks, layout=r.layout,
                       global_batch=r.global_batch, status=r.status, run_dir=os.path.abspath(r.dir),
                       point=r.point, repeat=r.repeat)
            row.update({k: r.stats[k] for k in r.stats})
            rows.append(row)
    md.append(THEORY)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(args.out, "report.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    print(f"scripts/report: {len(runs)} run(s), {len(groups)} model(s): {args.out}/report.md, report.csv "
          f"and {4 * len(groups)} plots")
    return 0


if __name__ == "__main__":
    main_guard("scripts/report", main)
