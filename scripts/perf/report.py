"""The report of a campaign: tables and plots of its runs, by model.

    scripts/report RUN_DIR... -o OUT_DIR [--warmup N] [--skip-bad] [--machine FILE [--cubelm PATH]]

RUN_DIR is a run directory (deck.toml, metrics.jsonl, and check.json and
run.json when scripts/sweep made it) or a campaign directory holding run
directories. Writes OUT_DIR/report.md, OUT_DIR/report.csv (one row per run,
full precision), OUT_DIR/points.csv (one row per deck: its repeats' median,
lowest and highest) and, for each model of each campaign, PNG plots of
1000 x 600 pixels: step time and its split, throughput with speedup and
parallel efficiency, bytes per rank, memory per rank, the loss differences and,
with --machine, predicted against measured step time. docs/perf-runs.md says
how to read them.

One statistic throughout, tables and plots alike. A run's step time is the
median over its steps after the first N (--warmup, default 1) that were not
skipped of the step's time averaged over the ranks (`step_ms.mean`); compute,
exposed communication and idle are that median step's parts (the mean of the
two middle steps' for an even count), so they add up to it. A deck run several
times (scripts/sweep --repeat) is one point: the median run's numbers (the mean
of the two middle runs' for an even count), with the lowest and highest run
beside them. Tokens/s is tokens per step over that step time; speedup and
efficiency compare tokens/s with the run of the fewest ranks of the model;
MFU is the model's FLOPs per rank over that step time against one peak per
campaign: the median of the runs' start-up sgemm measurements of a node per
thread they ran on, times each rank's threads and share of its node (raised to
the highest rate a run reached, if one beat it). Bytes per rank are the median over the steps of `comm_bytes`, beside
the closed form of `cubelm check --json`; memory is rank 0's allocation beside
the estimate for the fullest rank; the final loss is the last step's, the final
validation loss the last validation's (runs with data.val_fraction or data.val_path;
the loss plot draws it dashed beside the training loss).
"""

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys

from common import (MODES, ROOT, UserError, load_deck, main_guard, mode_of, model_text, read_json,
                    world_of)

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
NUMBER_KEYS = ("step", "ms", "tokens_per_s", "gflops_per_rank", "mfu", "peak_gflops", "mem_bytes", "comm_bytes")
SPLIT_KEYS = ("compute_ms", "comm_ms", "idle_ms")  # the parts of a step, adding up to it
CSV_COLUMNS = ["campaign", "model", "mode", "ranks", "layout", "global_batch", "steps", "steps_measured",
               "step_ms_median", "step_ms_p90", "compute_ms", "comm_ms", "idle_ms", "tokens_per_step",
               "tokens_per_s", "speedup", "efficiency", "comm_bytes", "comm_bytes_closed_form", "mem_bytes",
               "mem_bytes_estimate", "gflop_per_rank_step", "peak_share", "peak_threads", "thread_gflops",
               "peak_gflops", "mfu",
               "predicted_step_ms", "final_loss", "final_val_loss", "status", "run_dir", "point", "repeat"]
POINT_COLUMNS = ["campaign", "model", "point", "mode", "ranks", "layout", "global_batch", "repeats",
                 "step_ms_median", "step_ms_low", "step_ms_high", "step_ms_p90", "compute_ms", "comm_ms", "idle_ms",
                 "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high", "speedup", "efficiency", "comm_bytes",
                 "comm_bytes_closed_form", "mem_bytes", "mem_bytes_estimate", "peak_gflops", "mfu",
                 "predicted_step_ms", "final_loss", "final_val_loss"]
NAN = math.nan


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def median_split(items, total):
    """The median of `items` (dicts of numbers) by the key `total`, with each other number
    of that median item: the middle item's, or the mean of the two middle items' for an even
    count (so the total is the usual median). Parts that add up to the total in every item
    (compute + comm + idle = step) add up to it in the median too."""
    order = sorted(items, key=lambda d: d[total])
    n = len(order)
    middle = order[(n - 1) // 2:n // 2 + 1]
    return {k: float(np.mean([d[k] for d in middle])) for k in order[0]}


def model_gflops(stats):
    """The model's GFLOP/s per rank at the step time of `stats`."""
    return stats["gflop_per_rank_step"] / (stats["step_ms_median"] / 1e3)


def derive(stats, thread_gflops):
    """Tokens/s and MFU of a run or point from its step time: tokens per step over the step,
    the model's GFLOP per rank and step over the step against the campaign's rate per thread
    times the rank's threads and share of its node (the run's own start-up peak when its
    metrics carry no share)."""
    step_s = stats["step_ms_median"] / 1e3
    shared = finite(thread_gflops) and finite(stats["peak_share"])
    peak = thread_gflops * stats["peak_threads"] * stats["peak_share"] if shared else stats["own_peak_gflops"]
    return {"tokens_per_s": stats["tokens_per_step"] / step_s, "peak_gflops": peak,
            "mfu": model_gflops(stats) / peak if peak > 0 else NAN}


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
        self.machine = machine_of(os.path.join(path, "train.log"))
        check_path = os.path.join(path, "check.json")
        self.check = read_json(check_path) if os.path.isfile(check_path) else None
        if self.check is not None:
            for key in ("comm_bytes", "mem_bytes", "world", "tokens_per_step", "flops_per_step"):
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

    @property
    def pure(self):
        """Tensor parallel alone: no data, pipeline or context parallelism beside the group."""
        return self.ranks == self.tensor_size

    def compute_stats(self):
        m = self.measured
        parts = [{"step_ms": s["step_ms"]["mean"], "compute_ms": s["compute_ms"]["mean"],
                  "comm_ms": math.fsum(g["mean"] for g in s["comm_ms"].values()), "idle_ms": s["idle_ms"]["mean"]}
                 for s in m]
        middle = median_split(parts, "step_ms")
        shares = [s.get("peak_share") for s in m]
        shared = all(finite(x) and x > 0 for x in shares)
        threads = [s.get("peak_threads", 1) for s in m]
        last = max(self.steps, key=lambda s: s["step"])
        return {
            "steps": len(self.steps),
            "steps_measured": len(m),
            "step_ms_median": middle["step_ms"],
            "step_ms_p90": float(np.percentile([d["step_ms"] for d in parts], 90)),
            **{k: middle[k] for k in SPLIT_KEYS},
            # the step's tokens and model GFLOP per rank: check.json's, else rank 0's rates
            # times its step time
            "tokens_per_step": (float(self.check["tokens_per_step"]) if self.check else
                                float(np.median([s["tokens_per_s"] * s["ms"] / 1e3 for s in m]))),
            "gflop_per_rank_step": (self.check["flops_per_step"] / 1e9 / self.ranks if self.check else
                                    float(np.median([s["gflops_per_rank"] * s["ms"] / 1e3 for s in m]))),
            "peak_share": float(np.median(shares)) if shared else NAN,
            "peak_threads": int(np.median(threads)),
            # the node's rate alone per thread it was measured with (per device in a GPU build):
            # the peak over the share and threads (the lowest, should a step have raised it)
            "thread_gflops": (min(s["peak_gflops"] / s["peak_share"] / s.get("peak_threads", 1) for s in m)
                              if shared else NAN),
            "own_peak_gflops": float(min(s["peak_gflops"] for s in m)),
            "comm_bytes": float(np.median([s["comm_bytes"] for s in m])),
            "comm_bytes_closed_form": float(self.check["comm_bytes"]) if self.check else NAN,
            "mem_bytes": float(max(s["mem_bytes"] for s in m)),
            "mem_bytes_estimate": float(self.check["mem_bytes"]) if self.check else NAN,
            "final_loss": float(last["loss"]) if last["loss"] is not None else NAN,
            # the last validation's loss (data.val_fraction / data.val_path), if any
            "final_val_loss": next((float(s["val_loss"]) for s in reversed(self.steps)
                                    if s.get("val_loss") is not None), NAN),
        }


def machine_of(log):
    """The machine of a run, from its train.log's job headers (scripts/perf/job.sh):
    'host: processor, N CPUs[, GPUs]'; None when the log names none."""
    host = node = None
    try:
        with open(log, errors="replace") as f:
            for line in f:
                if line.startswith("=== job "):
                    found = re.match(r"=== job \S+ on ([^,]+),", line)
                    host = found.group(1) if found else host
                elif line.startswith("=== node: "):
                    node = line[len("=== node: "):].strip()
    except OSError:
        return None
    return f"{host}: {node}" if host and node else node


class Point:
    """The repeats of one deck (scripts/sweep --repeat): the median run's numbers (the mean of
    the two middle runs' for an even count), the lowest and highest beside them; numbers that
    are not times are medians over the repeats. A point of one run is that run."""

    def __init__(self, runs):
        runs = sorted(runs, key=lambda r: r.repeat)
        self.runs = runs
        first = runs[0]
        for key in ("mode", "ranks", "layout", "model", "global_batch", "tensor_size", "campaign", "machine",
                    "pure"):
            setattr(self, key, getattr(first, key))
        self.name = first.point
        self.repeats = len(runs)
        self.steps = first.steps  # the loss curve of the first repeat
        self.status = first.status if all(r.status == first.status for r in runs) else \
            ", ".join(f"r{r.repeat} {r.status}" for r in runs)
        self.stats, self.low, self.high = {}, {}, {}
        for key in first.stats:
            values = [r.stats[key] for r in runs]
            good = [v for v in values if finite(v)]
            self.stats[key] = float(np.median(good)) if good else NAN
            self.low[key] = min(good) if good else NAN
            self.high[key] = max(good) if good else NAN
        self.stats.update(median_split([{k: r.stats[k] for k in ("step_ms_median",) + SPLIT_KEYS} for r in runs],
                                       "step_ms_median"))

    def derive(self, thread_gflops):
        self.stats.update(derive(self.stats, thread_gflops))


def points_of(runs):
    """Runs grouped by their deck's point, in the runs' order."""
    by = {}
    for r in runs:
        by.setdefault(r.point, []).append(r)
    return [Point(rs) for rs in by.values()]


class CampaignPeak:
    """One rate for the MFU of every run of a campaign: the median of the runs' start-up sgemm
    measurements of a node per thread they ran on (per device in a GPU build), raised to the
    highest rate per thread and unit of share a run reached should one beat it (cubelm's own
    rule: a peak no step beats, docs/launching.md#mfu). A run's peak is that rate times its
    threads and its share of the node."""

    def __init__(self, runs):
        measured = [r.stats["thread_gflops"] for r in runs if finite(r.stats["thread_gflops"])]
        self.count = len(measured)
        self.without = [r for r in runs if not finite(r.stats["thread_gflops"])]
        if not measured:
            self.value = self.median = self.low = self.high = NAN
            self.raised = False
            return
        self.median, self.low, self.high = float(np.median(measured)), min(measured), max(measured)
        reached = max(model_gflops(r.stats) / (r.stats["peak_share"] * r.stats["peak_threads"])
                      for r in runs if finite(r.stats["thread_gflops"]))
        self.raised = reached > self.median
        self.value = max(self.median, reached)

    def text(self):
        if not self.count:
            return ("MFU against each run's own start-up peak (its metrics carry no `peak_share`: a cubelm "
                    "older than the campaign peak)")
        text = (f"MFU against one peak for the campaign: sgemm at {self.value:.1f} GFLOP/s per thread (per GPU "
                f"in a GPU build), times each rank's threads and its share of the node (the median of "
                f"{self.count} run(s)' start-up measurements, {self.low:.1f} to {self.high:.1f} GFLOP/s")
        text += ", raised to the highest rate a run reached)" if self.raised else ")"
        if self.count > 1 and self.high > 1.5 * self.low:
            text += "; the measurements differ by more than 1.5x: a busy or noisy node at start-up"
        if self.without:
            text += "; " + ", ".join(r.name for r in self.without) + " against their own peak (no `peak_share`)"
        return text


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
            if "val_loss" in s and not (s["val_loss"] is None or isinstance(s["val_loss"], (int, float))):
                raise UserError(f"{where}: 'val_loss' is not a number")
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
            if "peak_share" in s and not (finite(s["peak_share"]) and 0 < s["peak_share"] <= 1):
                raise UserError(f"{where}: 'peak_share' is {s['peak_share']!r}, expected a number in (0, 1]")
            if "peak_threads" in s and not (isinstance(s["peak_threads"], int) and s["peak_threads"] >= 1):
                raise UserError(f"{where}: 'peak_threads' is {s['peak_threads']!r}, expected a whole number >= 1")
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


# ------------------------------------------------------------- predictions --
def cubelm_program(given):
    program = given or os.environ.get("CUBELM") or os.path.join(ROOT, "build", "cpu", "src", "cubelm")
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        raise UserError(f"{'--cubelm ' if given else ''}{program}: not an executable program (the cubelm "
                        "that runs `check --machine` for the predictions; --cubelm or $CUBELM names another)")
    return os.path.abspath(program)


def predict(point, machine, cubelm):
    """`cubelm check deck.toml --machine FILE --json` in the point's first run directory:
    (the predicted step in ms or NaN, the target's name, why there is none)."""
    run_dir = point.runs[0].dir
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([cubelm, "check", "deck.toml", "--machine", machine, "--json"], cwd=run_dir,
                          capture_output=True, text=True, env=env)
    try:
        out = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise UserError(f"{run_dir}: `cubelm check deck.toml --machine {machine} --json` printed no JSON "
                        f"(exit {done.returncode}): {done.stderr.strip()[-400:]}") from None
    pred = out.get("prediction")
    target = re.sub(r" \([^()]*\)$", "", out.get("target", machine))  # the name without the file
    if not isinstance(pred, dict) or not finite(pred.get("step_ms")):
        return NAN, target, (done.stderr.strip().splitlines() or ["no prediction"])[-1]
    return float(pred["step_ms"]), target, ""


# ------------------------------------------------------------------ tables --
def fmt_split(ms, step):
    return f"{ms:.2f} ({100.0 * ms / step:.0f}%)" if step > 0 else f"{ms:.2f}"


def fmt(x, spec):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(points, predicted):
    head = ["mode", "ranks", "layout", "step ms", "step ms p90", "compute ms (share)", "exposed comm ms (share)",
            "idle ms (share)", "tokens/s", "speedup", "efficiency %", "MB/rank/step measured",
            "MB/rank/step closed form", "MiB/rank measured", "MiB/rank estimate", "MFU %"]
    head += ["predicted step ms"] if predicted else []
    head += ["final loss"]
    validated = any(finite(r.stats["final_val_loss"]) for r in points)
    head += ["final validation loss"] if validated else []
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in points:
        s = r.stats
        spread = (lambda key, spec: f" [{format(r.low[key], spec)}-{format(r.high[key], spec)}]"
                  if r.repeats > 1 else "")
        cells = [r.mode, str(r.ranks), r.layout, f"{s['step_ms_median']:.2f}" + spread("step_ms_median", ".2f"),
                 f"{s['step_ms_p90']:.2f}"]
        cells += [fmt_split(s[k], s["step_ms_median"]) for k in SPLIT_KEYS]
        cells += [f"{s['tokens_per_s']:.0f}" + spread("tokens_per_s", ".0f"), f"{s['speedup']:.2f}",
                  f"{100 * s['efficiency']:.1f}",
                  f"{s['comm_bytes'] / 1e6:.3f}", fmt(s["comm_bytes_closed_form"] / 1e6, ".3f"),
                  f"{s['mem_bytes'] / 2**20:.2f}", fmt(s["mem_bytes_estimate"] / 2**20, ".2f"),
                  fmt(100 * s["mfu"], ".2f")]
        cells += [fmt(s["predicted_step_ms"], ".2f")] if predicted else []
        cells += [fmt(s["final_loss"], ".4f")]
        cells += [fmt(s["final_val_loss"], ".4f")] if validated else []
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def reference_of(points):
    """The point the others are compared with: the fewest ranks, then the mode's order."""
    return min(points, key=lambda r: (r.ranks, MODES.index(r.mode), r.name))


def val_losses(run):
    """{step: validation loss} of the steps after which a run validated."""
    return {s["step"]: s["val_loss"] for s in run.steps if s.get("val_loss") is not None}


def loss_agreement(points):
    """Lines saying how far each point's losses are from the reference's of the same global batch."""
    lines = []
    for batch, rs in sorted(by_batch(points).items()):
        ref = reference_of(rs)
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
        text += f" ({where[0].mode} at {where[0].ranks} ranks, step {where[1]})" if where else ""
        ref_val = val_losses(ref)
        val_worst = [abs(v - ref_val[k]) for r in rs for k, v in val_losses(r).items() if k in ref_val]
        if val_worst:
            text += f"; validation loss {max(val_worst):.3g}"
        lines.append(text)
    return lines


def by_batch(points):
    out = {}
    for r in points:
        out.setdefault(r.global_batch, []).append(r)
    return out


# ------------------------------------------------------------------- plots --
def finish(fig, title, path):
    """Every plot's end: the section's title above, written to path as a PNG."""
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def slug(text):
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def rank_axis(ax, runs):
    ax.set_xscale("log", base=2)
    ticks = sorted({r.ranks for r in runs})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ranks")
    ax.grid(True, which="major", alpha=0.3)


def plain_log_axis(axis):
    """Tick labels of a log axis as plain numbers (1.5, 20, 300), not powers of ten."""
    text = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(text)
    axis.set_minor_formatter(text)
    for label in axis.get_minorticklabels():
        label.set_fontsize(7)


def by_mode(points):
    """(mode, its points tensor parallel alone by ranks, its points with data, pipeline or
    context parallelism beside) in the modes' order: the first are a mode's scaling curve,
    the others single markers labelled with their layout."""
    out = {}
    for r in points:
        out.setdefault(r.mode, []).append(r)
    return [(m, sorted([r for r in out[m] if r.pure], key=lambda r: r.ranks),
             sorted([r for r in out[m] if not r.pure], key=lambda r: r.ranks)) for m in MODES if m in out]


def draw_series(ax, points, value, low=None, high=None, label=""):
    """Each mode's points: the pure ones joined (filled circles), the others apart (open
    triangles with their layout); bars from low to high where given."""
    for mode, pure, mixed in by_mode(points):
        c = COLORS[mode]
        for rs, style, name in ((pure, dict(marker="o", linestyle="-"), f"{mode}{label}"),
                                (mixed, dict(marker="^", linestyle="none", markerfacecolor="none", markersize=9),
                                 f"{mode} with dp/pp{label}")):
            if not rs:
                continue
            x = np.array([r.ranks for r in rs], dtype=float)
            y = np.array([value(r) for r in rs], dtype=float)
            if low is not None:
                err = [y - np.array([low(r) for r in rs]), np.array([high(r) for r in rs]) - y]
                ax.errorbar(x, y, yerr=err, color=c, capsize=3, label=name, **style)
            else:
                ax.plot(x, y, color=c, label=name, **style)
            if rs is mixed:
                for r, xi, yi in zip(rs, x, y):
                    ax.annotate(r.layout.replace(f"tp {mode}:", "tp "), (xi, yi), textcoords="offset points",
                                xytext=(6, -12), fontsize=7, color=c)


def spread_of(points, key):
    """The error bars of a key: lowest to highest repeat, or None when no point is repeated."""
    if max(r.repeats for r in points) == 1:
        return None, None
    return (lambda r: r.low[key]), (lambda r: r.high[key])


def plot_step_time(points, title, path):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax1 = fig.add_axes([0.07, 0.12, 0.36, 0.72])
    ax2 = fig.add_axes([0.51, 0.22, 0.47, 0.62])
    low, high = spread_of(points, "step_ms_median")
    if low is None:  # one run a point: its own 90th percentile
        low, high = (lambda r: r.stats["step_ms_median"]), (lambda r: r.stats["step_ms_p90"])
    draw_series(ax1, points, lambda r: r.stats["step_ms_median"], low, high)
    rank_axis(ax1, points)
    ax1.set_ylim(bottom=0)
    repeated = max(r.repeats for r in points) > 1
    ax1.set_ylabel("median step, ms; bar: lowest to highest repeat" if repeated
                   else "median step, ms; bar to the 90th percentile")
    ax1.legend(fontsize=8)
    ax1.set_title("step time (mean over ranks)", fontsize=10)
    order = sorted(points, key=lambda r: (r.ranks, MODES.index(r.mode), r.name))
    labels = [f"{r.mode}\n{r.layout.split(' x ', 1)[1] if ' x ' in r.layout else r.ranks}" for r in order]
    x = np.arange(len(order))
    bottom = np.zeros(len(order))
    for key, name, color in (("compute_ms", "compute", "tab:gray"), ("comm_ms", "exposed communication", "tab:purple"),
                             ("idle_ms", "idle (pipeline)", "tab:olive")):
        v = np.array([r.stats[key] for r in order])
        ax2.bar(x, v, bottom=bottom, color=color, label=name)
        bottom += v
    ax2.set_ylim(0, 1.3 * bottom.max())
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, fontsize=8)
    ax2.set_xlabel("mode, ranks (or the parallelism beside the tensor group)")
    ax2.set_ylabel("ms: the median step's parts")
    ax2.legend(fontsize=8)
    ax2.set_title("where the median step's time goes (the bars add up to it)", fontsize=10)
    finish(fig, title, path)


def plot_scaling(points, title, path):
    ref = reference_of(points)
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    axes = [fig.add_axes([0.07 + 0.32 * i, 0.1, 0.25, 0.72]) for i in range(3)]
    low, high = spread_of(points, "tokens_per_s")
    draw_series(axes[0], points, lambda r: r.stats["tokens_per_s"], low, high)
    base = ref.stats["tokens_per_s"]
    draw_series(axes[1], points, lambda r: r.stats["speedup"],
                None if low is None else (lambda r: low(r) / base), None if low is None else (lambda r: high(r) / base))
    draw_series(axes[2], points, lambda r: 100 * r.stats["efficiency"],
                None if low is None else (lambda r: 100 * low(r) / base * ref.ranks / r.ranks),
                None if low is None else (lambda r: 100 * high(r) / base * ref.ranks / r.ranks))
    xs = np.array(sorted({r.ranks for r in points}), dtype=float)
    axes[1].plot(xs, xs / ref.ranks, ":", color="gray", linewidth=2, label="ideal")
    axes[2].axhline(100, linestyle=":", color="gray", linewidth=2, label="ideal")
    for ax, ylabel in zip(axes, ("tokens/s (whole job)", f"speedup over {ref.mode} at {ref.ranks}",
                                 f"parallel efficiency %, against {ref.mode} at {ref.ranks}")):
        rank_axis(ax, points)
        ax.set_ylabel(ylabel)
    for ax in axes[:2]:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    axes[2].set_ylim(0, max(110, 1.1 * max(100 * r.stats["efficiency"] for r in points)))
    axes[0].legend(fontsize=7)
    axes[0].set_title("throughput", fontsize=10)
    axes[1].set_title("speedup", fontsize=10)
    axes[2].set_title("efficiency = speedup x ranks ref. / ranks", fontsize=10)
    finish(fig, title, path)


def plot_bytes(points, title, path):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_axes([0.09, 0.1, 0.6, 0.76])
    sending = [r for r in points if r.stats["comm_bytes"] > 0]
    left_out = [r for r in points if r.stats["comm_bytes"] <= 0]
    draw_series(ax, sending, lambda r: r.stats["comm_bytes"] / 1e6, label=" measured")
    for mode, pure, mixed in by_mode(sending):
        c = COLORS[mode]
        rs = pure + mixed
        closed = np.array([r.stats["comm_bytes_closed_form"] for r in rs]) / 1e6
        if np.isfinite(closed).any():
            ax.plot([r.ranks for r in rs], closed, "s", color=c, markerfacecolor="none", markersize=11,
                    label=f"{mode} closed form")
        # The theory for the runs that are tensor parallel alone, through the first of them,
        # over the plot's ranks (a mode of one such run still shows where it would go).
        if mode in THEORY_CURVES and pure:
            f, text = THEORY_CURVES[mode]
            xs = np.geomspace(min(r.ranks for r in sending), max(r.ranks for r in sending), 50)
            ax.plot(xs, pure[0].stats["comm_bytes"] / 1e6 * f(xs) / f(pure[0].ranks), ":", color=c, linewidth=2,
                    label=f"{mode} theory ∝ {text}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({r.ranks for r in sending})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    plain_log_axis(ax.yaxis)
    ax.set_xlabel("ranks")
    ax.set_ylabel("MB sent per rank per step (rank 0, modelled)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    note = ("lines: tensor parallel alone; triangles: with data or pipeline parallelism, which adds the "
            "gradient reduction;\ndotted: each mode's closed-form leading term through its first point on a line")
    if left_out:
        note += "; left out (no traffic): " + ", ".join(f"{r.mode} at {r.ranks}" for r in left_out)
    ax.set_title(note, fontsize=8)
    finish(fig, title, path)


def plot_memory(points, title, path):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_axes([0.09, 0.1, 0.6, 0.76])
    draw_series(ax, points, lambda r: r.stats["mem_bytes"] / 2**20, label=", rank 0 allocated")
    for mode, pure, mixed in by_mode(points):
        rs = pure + mixed
        est = np.array([r.stats["mem_bytes_estimate"] for r in rs]) / 2**20
        if np.isfinite(est).any():
            ax.plot([r.ranks for r in rs], est, "s", color=COLORS[mode], markerfacecolor="none", markersize=11,
                    label=f"{mode} fullest rank, estimate")
    first = reference_of(points)
    xs = np.array(sorted({r.ranks for r in points}), dtype=float)
    if len(xs) > 1:
        ax.plot(xs, first.stats["mem_bytes"] / 2**20 * first.ranks / xs, ":", color="gray", linewidth=2,
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
    finish(fig, title, path)


LOSS_AXES = ([0.07, 0.1, 0.22, 0.72], [0.37, 0.1, 0.42, 0.72])  # campaign_check.py reads inside these


def plot_loss(points, title, path, agreement):
    """Left, the reference's loss curve of each global batch; right, every other point's
    loss minus that curve, step by step: what ten overlapping curves would hide."""
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax_ref, ax = (fig.add_axes(box) for box in LOSS_AXES)
    markers = ["o", "s", "^", "v", "D", "P", "X", "*", "<", ">"]
    refs = []
    for batch, rs in sorted(by_batch(points).items()):
        ref = reference_of(rs)
        ref_loss = {s["step"]: s["loss"] for s in ref.steps if s["loss"] is not None}
        steps = sorted(ref_loss)
        ax_ref.plot(steps, [ref_loss[k] for k in steps], "-", color=COLORS[ref.mode], linewidth=2)
        # Validation losses beside the training loss: open circles on a dashed line.
        ref_val = val_losses(ref)
        if ref_val:
            vs = sorted(ref_val)
            ax_ref.plot(vs, [ref_val[k] for k in vs], "--o", color=COLORS[ref.mode], linewidth=1,
                        markerfacecolor="none", label="validation")
        refs.append(f"{ref.mode} at {ref.ranks}, batch {batch}")
        others = sorted((r for r in rs if r is not ref), key=lambda r: (MODES.index(r.mode), r.ranks))
        for i, r in enumerate(others):
            pts = [(s["step"], s["loss"] - ref_loss[s["step"]]) for s in r.steps
                   if s["loss"] is not None and s["step"] in ref_loss]
            # Differences that agree lie on top of each other: each point marks every n-th
            # step from its own, so that every point shows.
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker=markers[i % len(markers)],
                    markevery=(i % max(len(pts), 1), max(len(others), 1)), markersize=7, color=COLORS[r.mode],
                    label=f"{r.mode} at {r.ranks} (batch {batch})")
            vpts = sorted((k, v - ref_val[k]) for k, v in val_losses(r).items() if k in ref_val)
            if vpts:
                ax.plot([p[0] for p in vpts], [p[1] for p in vpts], "--", marker=markers[i % len(markers)],
                        markerfacecolor="none", markersize=9, color=COLORS[r.mode],
                        label=f"{r.mode} at {r.ranks} (batch {batch}), validation")
    ax.axhline(0, color="gray", linewidth=0.8)
    for a in (ax_ref, ax):
        a.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax_ref.set_xlabel("step")
    ax_ref.set_ylabel("training loss (validation: dashed), nats/token")
    ax_ref.set_title("reference: " + "\n".join(refs), fontsize=8)
    ax_ref.grid(True, alpha=0.3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss − reference's loss, same step")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title("\n".join(agreement), fontsize=8)
    finish(fig, title, path)


def plot_predicted(points, title, path, target):
    fig = plt.figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_axes([0.09, 0.1, 0.6, 0.72])
    have = [r for r in points if finite(r.stats["predicted_step_ms"])]
    for mode, pure, mixed in by_mode(have):
        for rs, marker in ((pure, "o"), (mixed, "^")):
            if not rs:
                continue
            x = [r.stats["predicted_step_ms"] for r in rs]
            y = [r.stats["step_ms_median"] for r in rs]
            kw = dict(yerr=[[r.stats["step_ms_median"] - r.low["step_ms_median"] for r in rs],
                            [r.high["step_ms_median"] - r.stats["step_ms_median"] for r in rs]]) \
                if max(r.repeats for r in rs) > 1 else {}
            ax.errorbar(x, y, fmt=marker, color=COLORS[mode], capsize=3,
                        markerfacecolor="none" if marker == "^" else COLORS[mode],
                        label=mode if marker == "o" else f"{mode} with dp/pp", **kw)
            for r, xi, yi in zip(rs, x, y):
                ax.annotate(str(r.ranks) if r.pure else r.layout, (xi, yi), textcoords="offset points",
                            xytext=(5, 4), fontsize=7, color=COLORS[mode])
    values = [v for r in have for v in (r.stats["predicted_step_ms"], r.stats["step_ms_median"])]
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        xs = np.geomspace(lo, hi, 10)
        ax.plot(xs, xs, "-", color="gray", label="measured = predicted")
        ax.plot(xs, 2 * xs, ":", color="gray", label="2x, 1/2x")
        ax.plot(xs, xs / 2, ":", color="gray")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_axis(ax.xaxis)
    plain_log_axis(ax.yaxis)
    ax.set_xlabel("predicted step, ms")
    ax.set_ylabel("measured median step, ms")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    note = f"predicted by `cubelm check --machine` for {target}"
    missing = [r for r in points if not finite(r.stats["predicted_step_ms"])]
    if missing:
        note += "\nno prediction: " + ", ".join(f"{r.mode} at {r.ranks}" for r in missing)
    ax.set_title(note, fontsize=8)
    finish(fig, title, path)


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


def count_text(values, unit):
    values = sorted(set(values))
    return f"{'/'.join(map(str, values))} {unit}{'s' if values != [1] else ''}"


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
    parser.add_argument("--machine", metavar="FILE",
                        help="a machine file (inputs/machines): plot each deck's step time as `cubelm check "
                             "--machine FILE` predicts it against the measured one")
    parser.add_argument("--cubelm", metavar="PATH",
                        help="the cubelm that runs the predictions (default: $CUBELM, else build/cpu/src/cubelm)")
    args = parser.parse_args()
    if args.warmup < 0:
        raise UserError(f"--warmup {args.warmup}: at least 0")
    cubelm = None
    if args.machine:
        if not os.path.isfile(args.machine):
            raise UserError(f"--machine {args.machine}: no such file")
        args.machine = os.path.abspath(args.machine)
        cubelm = cubelm_program(args.cubelm)
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

    peaks = {}
    for r in runs:
        peaks.setdefault(r.campaign, []).append(r)
    peaks = {c: CampaignPeak(rs) for c, rs in peaks.items()}
    for r in runs:
        r.stats.update(derive(r.stats, peaks[r.campaign].value))
    groups = {}
    for r in runs:
        groups.setdefault((r.campaign, r.model), []).append(r)
    md = ["# cubelm perf report", "",
          f"{len(runs)} run(s) from {', '.join(sorted(set(args.runs)))}. Step statistics over the steps after "
          f"the first {args.warmup} (warm-up), one statistic throughout (docs/perf-runs.md#reading-the-report): "
          "a run's step time is its median step (the step's time averaged over the ranks), compute, exposed "
          "communication and idle are that step's parts and add up to it; a deck run several times is its "
          "median run, with the lowest and highest run in brackets and as the plots' bars; tokens/s, speedup, "
          "efficiency and MFU follow from that step time.", ""]
    if bad:
        md += ["Left out:", ""] + [f"- {b}" for b in bad] + [""]
    rows, point_rows, plots = [], [], 0
    for (campaign, model), runs_of_model in sorted(groups.items()):
        points = points_of(runs_of_model)
        points.sort(key=lambda r: (MODES.index(r.mode), r.ranks, r.name))
        for p in points:
            p.derive(peaks[campaign].value)
        ref = reference_of(points)
        for p in points + runs_of_model:
            p.stats["speedup"] = p.stats["tokens_per_s"] / ref.stats["tokens_per_s"]
            p.stats["efficiency"] = p.stats["speedup"] * ref.ranks / p.ranks
        target = None
        for p in points:
            p.stats["predicted_step_ms"], why = NAN, ""
            if args.machine:
                p.stats["predicted_step_ms"], target, why = predict(p, args.machine, cubelm)
            p.why = why
            for r in p.runs:
                r.stats["predicted_step_ms"] = p.stats["predicted_step_ms"]
        machines = sorted({p.machine for p in points if p.machine})
        machine = "; ".join(machines) if machines else "a machine not recorded (no '=== node:' in train.log)"
        steps = count_text([r.stats["steps"] for r in runs_of_model], "step")
        repeats = sorted({r.repeats for r in points})
        title = (f"{campaign}: {model}, {steps} ({args.warmup} warm-up)"
                 + (f", {count_text(repeats, 'repeat')}" if repeats != [1] else "") + f"\non {machine}")
        base = slug(f"{campaign}-{model}")
        agreement = loss_agreement(points)
        files = {k: f"{base}-{k}.png" for k in ("step-time", "scaling", "bytes", "memory", "loss")}
        if args.machine:
            files["predicted"] = f"{base}-predicted.png"
        plot_step_time(points, title, os.path.join(args.out, files["step-time"]))
        plot_scaling(points, title, os.path.join(args.out, files["scaling"]))
        plot_bytes(points, title, os.path.join(args.out, files["bytes"]))
        plot_memory(points, title, os.path.join(args.out, files["memory"]))
        plot_loss(points, title, os.path.join(args.out, files["loss"]), agreement)
        if args.machine:
            plot_predicted(points, title, os.path.join(args.out, files["predicted"]), target)
        plots += len(files)
        batches = sorted({r.global_batch for r in points})
        md += [f"## {title.replace(chr(10), ', ')}", "",
               f"Global batch {', '.join(map(str, batches))} sequences; {len(runs_of_model)} run(s)"
               + (f" of {len(points)} deck(s), repeated: each number is the deck's median run's, [lowest-highest] "
                  "run beside step time and tokens/s." if repeats != [1] else "."),
               f"Speedup and efficiency: tokens/s against {ref.mode} at {ref.ranks} rank(s). "
               + peaks[campaign].text() + ".", ""]
        md += table(points, bool(args.machine))
        if args.machine:
            md += ["", f"Predicted: `cubelm check deck.toml --machine {os.path.relpath(args.machine)} --json`'s "
                       f"step time ({target})."]
            md += [f"No prediction for {p.name}: {p.why}" for p in points if p.why]
        incomplete = [r for r in points if r.status not in ("ok", "unknown")]
        if incomplete:
            md += ["", "Not complete (run.json): " + ", ".join(f"{r.name} ({r.status})" for r in incomplete)]
        md += ["", "Loss: " + "; ".join(agreement) + ".", ""]
        captions = {"step-time": "step time and its split", "scaling": "tokens/s, speedup and efficiency",
                    "bytes": "bytes per rank per step", "memory": "memory per rank",
                    "loss": "loss differences", "predicted": "predicted against measured step time"}
        for k, f in files.items():
            md += [f"![{captions[k]}]({f})", ""]
        for r in sorted(runs_of_model, key=lambda r: (MODES.index(r.mode), r.ranks, r.name)):
            row = dict(campaign=campaign, model=model, mode=r.mode, ranks=r.ranks, layout=r.layout,
                       global_batch=r.global_batch, status=r.status, run_dir=os.path.abspath(r.dir),
                       point=r.point, repeat=r.repeat)
            row.update({k: r.stats[k] for k in CSV_COLUMNS if k in r.stats})
            rows.append(row)
        for p in points:
            row = dict(campaign=campaign, model=model, point=p.name, mode=p.mode, ranks=p.ranks, layout=p.layout,
                       global_batch=p.global_batch, repeats=p.repeats, step_ms_low=p.low["step_ms_median"],
                       step_ms_high=p.high["step_ms_median"], tokens_per_s_low=p.low["tokens_per_s"],
                       tokens_per_s_high=p.high["tokens_per_s"])
            row.update({k: p.stats[k] for k in POINT_COLUMNS if k in p.stats})
            point_rows.append(row)
    md.append(THEORY)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write("\n".join(md))
    for name, columns, table_rows in (("report.csv", CSV_COLUMNS, rows), ("points.csv", POINT_COLUMNS, point_rows)):
        with open(os.path.join(args.out, name), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
            w.writeheader()
            for row in table_rows:
                w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    print(f"scripts/report: {len(runs)} run(s), {len(groups)} model(s): {args.out}/report.md, report.csv, "
          f"points.csv and {plots} plots")
    return 0


if __name__ == "__main__":
    main_guard("scripts/report", main)
