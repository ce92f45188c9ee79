"""Checks a campaign's report against its run directories, computing every number
again from the metrics files on its own (Python's statistics module, not the
report's numpy), and checks that each PNG is a real image of the expected size.

    campaign_check.py CAMPAIGN_DIR REPORT_DIR MODE@RANKS... [--machine FILE --cubelm PATH]

MODE@RANKS lists the decks the report must hold (e.g. 1d@2 3d@8), no more, no
fewer; each may have been run several times (scripts/sweep --repeat). With
--machine, each deck's predicted step time is `cubelm check --machine` run here
again. Prints one line per check group and "PASS: report" at the end; the first
failure prints "FAIL: ..." and exits 1.

The statistics (docs/perf-runs.md#reading-the-report): a run's step time is the
median over its measured steps of `step_ms.mean`, its split that median step's
parts (the mean of the two middle steps' for an even count); a deck's numbers are
its median run's the same way; tokens/s, speedup, efficiency and MFU follow from
the step time, MFU against one rate per thread for the campaign.
"""

import csv
import json
import math
import os
import re
import statistics
import struct
import subprocess
import sys
import zlib

WARMUP = 1
PNG_SIZE = (1000, 600)
MODES = ("none", "1d", "1d+sp", "2d", "3d")
MODE_COLORS = {"none": (0, 0, 0), "1d": (31, 119, 180), "1d+sp": (255, 127, 14), "2d": (44, 160, 44),
               "3d": (214, 39, 40)}


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def close(a, b, rel=1e-9, abs_=1e-12):
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def middle(items, key):
    """The median item of `items` by `key`: the middle one, or for an even count the means of
    the two middle ones, key by key."""
    srt = sorted(items, key=lambda d: d[key])
    n = len(srt)
    mids = [srt[n // 2]] if n % 2 else [srt[n // 2 - 1], srt[n // 2]]
    return {k: statistics.fmean(d[k] for d in mids) for k in srt[0]}


def expected(run_dir):
    """Every number of a run's report row but those that need the campaign (MFU, speedup),
    from metrics.jsonl, check.json and deck.toml."""
    steps = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    steps.sort(key=lambda s: s["step"])
    m = [s for s in steps if s["step"] >= WARMUP and not s["skipped"]]
    for s in steps:  # the peak is one no step beats (docs/launching.md#mfu)
        if not s["mfu"] <= 1 or not s["peak_gflops"] >= s["gflops_per_rank"] * (1 - 1e-12):
            fail(f"{run_dir} step {s['step']}: MFU {s['mfu']} against a peak of {s['peak_gflops']} "
                 f"GFLOP/s/rank at {s['gflops_per_rank']}: the peak is below the step's rate")
        if not 0 < s["peak_share"] <= 1 or not s["peak_threads"] >= 1:
            fail(f"{run_dir} step {s['step']}: peak_share {s['peak_share']}, peak_threads {s['peak_threads']}")
    parts = [{"t": s["step_ms"]["mean"], "compute_ms": s["compute_ms"]["mean"],
              "comm_ms": math.fsum(g["mean"] for g in s["comm_ms"].values()), "idle_ms": s["idle_ms"]["mean"]}
             for s in m]
    # the 90th percentile by linear interpolation between closest ranks
    srt = sorted(d["t"] for d in parts)
    pos = 0.9 * (len(srt) - 1)
    lo = int(math.floor(pos))
    p90 = srt[lo] + (srt[min(lo + 1, len(srt) - 1)] - srt[lo]) * (pos - lo)
    mid = middle(parts, "t")
    check = json.load(open(os.path.join(run_dir, "check.json")))
    deck = open(os.path.join(run_dir, "deck.toml")).read()
    mode = re.search(r'^tensor_mode = "(\w+)"', deck, re.M).group(1)
    if re.search(r"^sequence_parallel = true", deck, re.M):
        mode += "+sp"
    info = json.load(open(os.path.join(run_dir, "run.json")))
    values = {
        "steps": len(steps),
        "steps_measured": len(m),
        "step_ms_median": statistics.median(d["t"] for d in parts),
        "step_ms_p90": p90,
        "compute_ms": mid["compute_ms"],
        "comm_ms": mid["comm_ms"],
        "idle_ms": mid["idle_ms"],
        "tokens_per_step": check["tokens_per_step"],
        "gflop_per_rank_step": check["flops_per_step"] / 1e9 / check["world"],
        "peak_share": statistics.median(s["peak_share"] for s in m),
        "peak_threads": statistics.median(s["peak_threads"] for s in m),
        "thread_gflops": min(s["peak_gflops"] / s["peak_share"] / s["peak_threads"] for s in m),
        "comm_bytes": statistics.median(s["comm_bytes"] for s in m),
        "comm_bytes_closed_form": check["comm_bytes"],
        "mem_bytes": max(s["mem_bytes"] for s in m),
        "mem_bytes_estimate": check["mem_bytes"],
        "final_loss": steps[-1]["loss"],
    }
    # The metrics' rates agree with the step's tokens and FLOPs of check.json.
    for s in m:
        if not close(s["tokens_per_s"] * s["ms"] / 1e3, check["tokens_per_step"], rel=1e-6):
            fail(f"{run_dir} step {s['step']}: tokens/s x ms = {s['tokens_per_s'] * s['ms'] / 1e3} tokens, "
                 f"check.json says {check['tokens_per_step']} per step")
        if not close(s["gflops_per_rank"] * s["ms"] / 1e3, values["gflop_per_rank_step"], rel=1e-6):
            fail(f"{run_dir} step {s['step']}: GFLOP/s per rank x ms = {s['gflops_per_rank'] * s['ms'] / 1e3} "
                 f"GFLOP, check.json says {values['gflop_per_rank_step']} per rank and step")
    return dict(mode=mode, ranks=check["world"], point=info.get("point", info["name"]), values=values,
                steps=steps, dir=run_dir)


def campaign_numbers(runs):
    """The numbers that need every run: one rate per thread for MFU (the median of the runs'
    measurements, raised to the highest rate per thread and share a run reached), then each
    run's tokens/s, peak and MFU from its step time."""
    node = statistics.median(r["values"]["thread_gflops"] for r in runs)
    for r in runs:
        v = r["values"]
        node = max(node, v["gflop_per_rank_step"] / (v["step_ms_median"] / 1e3) / v["peak_share"] / v["peak_threads"])
    for r in runs:
        derive(r["values"], node)
    return node


def derive(v, node):
    step_s = v["step_ms_median"] / 1e3
    v["tokens_per_s"] = v["tokens_per_step"] / step_s
    v["peak_gflops"] = node * v["peak_threads"] * v["peak_share"]
    v["mfu"] = v["gflop_per_rank_step"] / step_s / v["peak_gflops"]


def point_numbers(runs, node):
    """A deck's numbers from its runs: the median run's step and split, medians of the rest."""
    vs = [r["values"] for r in runs]
    p = {k: statistics.median(v[k] for v in vs) for k in vs[0]}
    p.update(middle([{k: v[k] for k in ("step_ms_median", "compute_ms", "comm_ms", "idle_ms")} for v in vs],
                    "step_ms_median"))
    derive(p, node)
    p["step_ms_low"] = min(v["step_ms_median"] for v in vs)
    p["step_ms_high"] = max(v["step_ms_median"] for v in vs)
    p["tokens_per_s_low"] = min(v["tokens_per_s"] for v in vs)
    p["tokens_per_s_high"] = max(v["tokens_per_s"] for v in vs)
    return p


def cell_number(cell, index=0):
    nums = re.findall(r"(?<![\d.])-?\d+(?:\.\d+)?|\d+(?:\.\d+)?", cell)  # "1.5-2.5": two numbers
    if len(nums) <= index:
        fail(f"table cell '{cell}' has no number #{index + 1}")
    text = nums[index]
    decimals = len(text.split(".")[1]) if "." in text else 0
    return float(text), 0.5 * 10 ** -decimals + 1e-9


def check_table_cell(where, cell, value, scale=1.0, index=0):
    shown, tol = cell_number(cell, index)
    if abs(shown - value * scale) > tol * (1 + 1e-6):
        fail(f"{where}: the table shows {shown} but the metrics give {value * scale:.6g}")


def png_pixels_check(path):
    """The PNG's structure by hand (signature, chunk CRCs, IHDR, IDAT size); returns (width, height)."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: no PNG signature")
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        if pos + 8 > len(data):
            fail(f"{path}: truncated chunk header at byte {pos}")
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            fail(f"{path}: CRC of chunk {kind!r} at byte {pos} does not match")
        chunks.append(kind)
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    if chunks[0] != b"IHDR" or chunks[-1] != b"IEND":
        fail(f"{path}: chunks {chunks[0]!r} ... {chunks[-1]!r}, expected IHDR ... IEND")
    channels = {2: 3, 6: 4, 0: 1, 4: 2}.get(color)
    if depth != 8 or channels is None:
        fail(f"{path}: bit depth {depth}, colour type {color}: not an 8-bit image")
    raw = zlib.decompress(idat)
    if len(raw) != height * (1 + width * channels):
        fail(f"{path}: {len(raw)} bytes of image data, expected {height * (1 + width * channels)}")
    filters = {raw[i * (1 + width * channels)] for i in range(height)}
    if not filters <= {0, 1, 2, 3, 4}:
        fail(f"{path}: row filter types {sorted(filters)}")
    return width, height


def option(args, name):
    """Removes `name VALUE` from args; returns VALUE or None."""
    if name not in args:
        return None
    i = args.index(name)
    value = args[i + 1]
    del args[i:i + 2]
    return value


def predicted_step_ms(run_dir, machine, cubelm):
    done = subprocess.run([cubelm, "check", "deck.toml", "--machine", machine, "--json"], cwd=run_dir,
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(done.stdout)["prediction"]["step_ms"]


def table_rows(md):
    """Every row of the report's tables, as {column name: cell}."""
    rows, head = [], None
    for line in md.splitlines():
        if line.startswith("| mode | ranks |"):
            head = [x.strip() for x in line.strip("|").split("|")]
        elif head and re.match(r"\| (none|1d|1d\+sp|2d|3d) \| \d+ \|", line):
            rows.append(dict(zip(head, [x.strip() for x in line.strip("|").split("|")])))
        elif not line.startswith("|"):
            head = None
    return rows


def main():
    args = sys.argv[1:]
    machine, cubelm = option(args, "--machine"), option(args, "--cubelm")
    machine, cubelm = (os.path.abspath(x) if x else x for x in (machine, cubelm))
    campaign, report = args[0], args[1]
    want = set(args[2:])
    runs = [expected(os.path.join(campaign, name)) for name in sorted(os.listdir(campaign))
            if os.path.isfile(os.path.join(campaign, name, "metrics.jsonl"))]
    decks = {}
    for r in runs:
        decks.setdefault(f"{r['mode']}@{r['ranks']}", []).append(r)
    if set(decks) != want:
        fail(f"the campaign directory holds runs of {sorted(decks)}, expected {sorted(want)}")
    for key, rs in decks.items():
        if len({r["point"] for r in rs}) != 1:
            fail(f"{key}: runs of several decks ({sorted({r['point'] for r in rs})})")
    node = campaign_numbers(runs)
    points = {key: point_numbers(rs, node) for key, rs in decks.items()}
    ref = min(decks, key=lambda k: (int(k.split("@")[1]), MODES.index(k.split("@")[0])))
    ref_ranks = int(ref.split("@")[1])
    for key, p in points.items():
        for v in [p] + [r["values"] for r in decks[key]]:
            v["speedup"] = v["tokens_per_s"] / points[ref]["tokens_per_s"]
            v["efficiency"] = v["speedup"] * ref_ranks / int(key.split("@")[1])
        p["predicted_step_ms"] = predicted_step_ms(decks[key][0]["dir"], machine, cubelm) if machine else None
        # one statistic: the step's parts add up to the step
        for v in [p] + [r["values"] for r in decks[key]]:
            if not close(v["compute_ms"] + v["comm_ms"] + v["idle_ms"], v["step_ms_median"], rel=1e-7):  # 9 digits
                fail(f"{key}: compute {v['compute_ms']} + comm {v['comm_ms']} + idle {v['idle_ms']} is not the "
                     f"step {v['step_ms_median']}")
        if not 0 < p["mfu"] <= 1:
            fail(f"{key}: MFU {100 * p['mfu']:.2f}%: a deck's MFU is above 0 and at most 100%")
    print(f"campaign: {len(runs)} runs of {len(decks)} decks; one rate {node:.1f} GFLOP/s per thread for MFU; "
          f"speedup against {ref}")

    # report.csv: one row per run, every number equal to the independent computation
    rows = list(csv.DictReader(open(os.path.join(report, "report.csv"))))
    got = {os.path.realpath(row["run_dir"]): row for row in rows}
    if set(got) != {os.path.realpath(r["dir"]) for r in runs} or len(rows) != len(runs):
        fail(f"report.csv has runs {sorted(got)}, expected the {len(runs)} of {campaign}")
    for r in runs:
        row = got[os.path.realpath(r["dir"])]
        key = f"{r['mode']}@{r['ranks']}"
        if f"{row['mode']}@{row['ranks']}" != key:
            fail(f"report.csv: {r['dir']} is {row['mode']}@{row['ranks']}, expected {key}")
        for k, v in r["values"].items():
            if not close(float(row[k]), float(v)):
                fail(f"report.csv: {r['dir']} {k} = {row[k]}, the metrics give {v!r}")
        if machine and not close(float(row["predicted_step_ms"]), points[key]["predicted_step_ms"]):
            fail(f"report.csv: {r['dir']} predicted {row['predicted_step_ms']} ms, cubelm check says "
                 f"{points[key]['predicted_step_ms']}")
    print(f"report.csv: {len(rows)} runs x {len(runs[0]['values'])} numbers agree with the metrics files")

    # points.csv: one row per deck, its median run's numbers
    prows = {f"{row['mode']}@{row['ranks']}": row for row in csv.DictReader(open(os.path.join(report, "points.csv")))}
    if set(prows) != want:
        fail(f"points.csv has decks {sorted(prows)}, expected {sorted(want)}")
    for key, p in points.items():
        if int(prows[key]["repeats"]) != len(decks[key]):
            fail(f"points.csv: {key} has {prows[key]['repeats']} repeats, the campaign {len(decks[key])}")
        for k, v in p.items():
            if k in prows[key] and v is not None and not close(float(prows[key][k]), float(v)):
                fail(f"points.csv: {key} {k} = {prows[key][k]}, the metrics give {v!r}")
    print(f"points.csv: {len(prows)} decks agree with their runs")

    # report.md: one table row per deck, each number as computed (to its digits)
    md = open(os.path.join(report, "report.md")).read()
    trs = table_rows(md)
    if sorted(f"{c['mode']}@{c['ranks']}" for c in trs) != sorted(want):
        fail(f"report.md has table rows {sorted(c['mode'] + '@' + c['ranks'] for c in trs)}, expected {sorted(want)}")
    for c in trs:
        key = f"{c['mode']}@{c['ranks']}"
        p, w = points[key], f"report.md {key}"
        check_table_cell(w + " step ms", c["step ms"], p["step_ms_median"])
        if len(decks[key]) > 1:
            check_table_cell(w + " step ms lowest", c["step ms"], p["step_ms_low"], index=1)
            check_table_cell(w + " step ms highest", c["step ms"], p["step_ms_high"], index=2)
            check_table_cell(w + " tokens/s lowest", c["tokens/s"], p["tokens_per_s_low"], index=1)
            check_table_cell(w + " tokens/s highest", c["tokens/s"], p["tokens_per_s_high"], index=2)
        check_table_cell(w + " step ms p90", c["step ms p90"], p["step_ms_p90"])
        for col, k in (("compute ms (share)", "compute_ms"), ("exposed comm ms (share)", "comm_ms"),
                       ("idle ms (share)", "idle_ms")):
            check_table_cell(f"{w} {k}", c[col], p[k])
            check_table_cell(f"{w} {k} share", c[col], 100 * p[k] / p["step_ms_median"], index=1)
        check_table_cell(w + " tokens/s", c["tokens/s"], p["tokens_per_s"])
        check_table_cell(w + " speedup", c["speedup"], p["speedup"])
        check_table_cell(w + " efficiency", c["efficiency %"], p["efficiency"], 100)
        check_table_cell(w + " bytes measured", c["MB/rank/step measured"], p["comm_bytes"], 1e-6)
        check_table_cell(w + " bytes closed form", c["MB/rank/step closed form"], p["comm_bytes_closed_form"], 1e-6)
        check_table_cell(w + " memory measured", c["MiB/rank measured"], p["mem_bytes"], 1 / 2**20)
        check_table_cell(w + " memory estimate", c["MiB/rank estimate"], p["mem_bytes_estimate"], 1 / 2**20)
        check_table_cell(w + " MFU", c["MFU %"], p["mfu"], 100)
        if machine:
            check_table_cell(w + " predicted", c["predicted step ms"], p["predicted_step_ms"])
        elif "predicted step ms" in c:
            fail(f"{w}: a predicted step time without --machine")
        check_table_cell(w + " final loss", c["final loss"], p["final_loss"])
    if f"{node:.1f} GFLOP/s" not in md:
        fail(f"report.md does not print the campaign's peak, sgemm at {node:.1f} GFLOP/s per thread")
    print(f"report.md: {len(trs)} table rows agree with the metrics files; the campaign's peak is printed")

    # The physics: measured traffic is the closed form, and every layout learns the same.
    for r in runs:
        v = r["values"]
        if not close(v["comm_bytes"], v["comm_bytes_closed_form"], rel=1e-9):
            fail(f"{r['dir']}: {v['comm_bytes']} bytes per step measured, closed form {v['comm_bytes_closed_form']}")
    ref_steps = {s["step"]: s["loss"] for s in decks[ref][0]["steps"]}
    worst = 0.0
    for r in runs:
        if [s["step"] for s in r["steps"]] != sorted(ref_steps):
            fail(f"{r['dir']}: steps {[s['step'] for s in r['steps']]} differ from {ref}'s")
        for s in r["steps"]:
            worst = max(worst, abs(s["loss"] - ref_steps[s["step"]]))
    if worst > 1e-4:
        fail(f"the loss curves differ by {worst:.3g} (more than 1e-4) from {ref}'s")
    print(f"traffic equals the closed form in every run; loss curves within {worst:.2g} of {ref}'s")

    # The plots: named in report.md, real PNGs of 1000 x 600 pixels; the loss plot draws the
    # reference in its mode's colour on the left and every other mode's difference on the right.
    pngs = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", md)
    kinds = ["step-time", "scaling", "bytes", "memory", "loss"] + (["predicted"] if machine else [])
    if sorted(next((k for k in kinds if p.endswith(f"-{k}.png")), p) for p in pngs) != sorted(kinds):
        fail(f"report.md names the plots {pngs}, expected one of each of {kinds}")
    for name in pngs:
        path = os.path.join(report, name)
        if not os.path.isfile(path):
            fail(f"report.md names {name}, which is not in {report}")
        size = png_pixels_check(path)
        if size != PNG_SIZE:
            fail(f"{path}: {size[0]} x {size[1]} pixels, expected {PNG_SIZE[0]} x {PNG_SIZE[1]}")
    import matplotlib.image  # Pillow decodes the pixels
    loss_png = next(p for p in pngs if p.endswith("-loss.png"))
    pixels = (matplotlib.image.imread(os.path.join(report, loss_png))[:, :, :3] * 255).round().astype(int)
    h, w = pixels.shape[:2]

    def hits(rgb, box):  # pixels of a colour inside an axes box of report.py's LOSS_AXES (inset)
        x0, y0, bw, bh = box
        inside = pixels[int((1 - y0 - bh) * h) + 3:int((1 - y0) * h) - 3, int(x0 * w) + 3:int((x0 + bw) * w) - 3]
        return int(((abs(inside - rgb).sum(axis=2)) <= 24).sum())

    ref_box, diff_box = [0.07, 0.1, 0.22, 0.72], [0.37, 0.1, 0.42, 0.72]
    if hits(MODE_COLORS[ref.split("@")[0]], ref_box) < 50:
        fail(f"{loss_png}: the reference's curve ({ref}) is not drawn in its colour on the left")
    for mode in {k.split("@")[0] for k in decks if k != ref}:
        n = hits(MODE_COLORS[mode], diff_box)
        if n < 50:
            fail(f"{loss_png}: only {n} pixels of {mode}'s colour {MODE_COLORS[mode]}: its difference is not drawn")
    print(f"plots: {len(pngs)} PNGs of {PNG_SIZE[0]} x {PNG_SIZE[1]} pixels, valid chunks and image data; "
          "the reference and every mode's difference in the loss plot")
    print("PASS: report")


if __name__ == "__main__":
    main()
