"""Checks a campaign's report against its run directories, computing every number
again from the metrics files on its own (Python's statistics module, not the
report's numpy), and checks that each PNG is a real image of the expected size.

    campaign_check.py CAMPAIGN_DIR REPORT_DIR MODE@RANKS...

MODE@RANKS lists the runs the report must hold (e.g. 1d@2 3d@8), no more, no
fewer. Prints one line per check group and "PASS: report" at the end; the
first failure prints "FAIL: ..." and exits 1.
"""

import csv
import json
import math
import os
import re
import statistics
import struct
import sys
import zlib

WARMUP = 1
PNG_SIZE = (1000, 600)
MODE_COLORS = {"none": (0, 0, 0), "1d": (31, 119, 180), "1d+sp": (255, 127, 14), "2d": (44, 160, 44),
               "3d": (214, 39, 40)}


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def close(a, b, rel=1e-9, abs_=1e-12):
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def expected(run_dir):
    """Every number of a run's report row, from metrics.jsonl, check.json and deck.toml."""
    steps = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    steps.sort(key=lambda s: s["step"])
    m = [s for s in steps if s["step"] >= WARMUP and not s["skipped"]]
    for s in steps:  # the peak is one no step beats (docs/launching.md#mfu)
        if not s["mfu"] <= 1 or not s["peak_gflops"] >= s["gflops_per_rank"] * (1 - 1e-12):
            fail(f"{run_dir} step {s['step']}: MFU {s['mfu']} against a peak of {s['peak_gflops']} "
                 f"GFLOP/s/rank at {s['gflops_per_rank']}: the peak is below the step's rate")
    ms = [s["ms"] for s in m]
    # the 90th percentile by linear interpolation between closest ranks
    srt = sorted(ms)
    pos = 0.9 * (len(srt) - 1)
    lo = int(math.floor(pos))
    p90 = srt[lo] + (srt[min(lo + 1, len(srt) - 1)] - srt[lo]) * (pos - lo)
    check = json.load(open(os.path.join(run_dir, "check.json")))
    deck = open(os.path.join(run_dir, "deck.toml")).read()
    mode = re.search(r'^tensor_mode = "(\w+)"', deck, re.M).group(1)
    if re.search(r"^sequence_parallel = true", deck, re.M):
        mode += "+sp"
    return mode, check["world"], {
        "steps": len(steps),
        "steps_measured": len(m),
        "step_ms_median": statistics.median(ms),
        "step_ms_p90": p90,
        "step_ms_mean": statistics.fmean(s["step_ms"]["mean"] for s in m),
        "compute_ms": statistics.fmean(s["compute_ms"]["mean"] for s in m),
        "comm_ms": statistics.fmean(math.fsum(g["mean"] for g in s["comm_ms"].values()) for s in m),
        "idle_ms": statistics.fmean(s["idle_ms"]["mean"] for s in m),
        "comm_bytes": statistics.median(s["comm_bytes"] for s in m),
        "comm_bytes_closed_form": check["comm_bytes"],
        "mem_bytes": max(s["mem_bytes"] for s in m),
        "mem_bytes_estimate": check["mem_bytes"],
        "mfu": statistics.median(s["mfu"] for s in m),
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in m),
        "final_loss": steps[-1]["loss"],
    }, steps


def cell_number(cell, index=0):
    nums = re.findall(r"-?\d+(?:\.\d+)?", cell)
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


def main():
    campaign, report = sys.argv[1], sys.argv[2]
    want = set(sys.argv[3:])
    runs = {}
    for name in sorted(os.listdir(campaign)):
        d = os.path.join(campaign, name)
        if os.path.isfile(os.path.join(d, "metrics.jsonl")):
            mode, ranks, values, steps = expected(d)
            runs[f"{mode}@{ranks}"] = (d, values, steps)
    if set(runs) != want:
        fail(f"the campaign directory holds runs {sorted(runs)}, expected {sorted(want)}")

    # report.csv: every number equal to the independent computation
    rows = list(csv.DictReader(open(os.path.join(report, "report.csv"))))
    got = {f"{r['mode']}@{r['ranks']}": r for r in rows}
    if set(got) != want:
        fail(f"report.csv has runs {sorted(got)}, expected {sorted(want)}")
    for key, (d, values, _) in runs.items():
        row = got[key]
        if os.path.realpath(row["run_dir"]) != os.path.realpath(d):
            fail(f"report.csv: {key} comes from {row['run_dir']}, expected {d}")
        for k, v in values.items():
            if not close(float(row[k]), float(v)):
                fail(f"report.csv: {key} {k} = {row[k]}, the metrics give {v!r}")
    print(f"report.csv: {len(rows)} runs x {len(values)} numbers agree with the metrics files")

    # report.md: one table row per run, each number as the metrics give it (to its digits)
    md = open(os.path.join(report, "report.md")).read()
    table_rows = [line for line in md.splitlines() if re.match(r"\| (none|1d|1d\+sp|2d|3d) \| \d+ \|", line)]
    if len(table_rows) != len(want):
        fail(f"report.md has {len(table_rows)} table rows, expected {len(want)}")
    for line in table_rows:
        c = [x.strip() for x in line.strip("|").split("|")]
        key = f"{c[0]}@{c[1]}"
        if key not in runs:
            fail(f"report.md: a row for {key}, which is not in the campaign")
        v = runs[key][1]
        w = f"report.md {key}"
        check_table_cell(w + " step ms median", c[3], v["step_ms_median"])
        check_table_cell(w + " step ms p90", c[4], v["step_ms_p90"])
        for i, k in ((5, "compute_ms"), (6, "comm_ms"), (7, "idle_ms")):
            check_table_cell(f"{w} {k}", c[i], v[k])
            check_table_cell(f"{w} {k} share", c[i], 100 * v[k] / v["step_ms_mean"], index=1)
        check_table_cell(w + " bytes measured", c[8], v["comm_bytes"], 1e-6)
        check_table_cell(w + " bytes closed form", c[9], v["comm_bytes_closed_form"], 1e-6)
        check_table_cell(w + " memory measured", c[10], v["mem_bytes"], 1 / 2**20)
        check_table_cell(w + " memory estimate", c[11], v["mem_bytes_estimate"], 1 / 2**20)
        check_table_cell(w + " MFU", c[12], v["mfu"], 100)
        if not 0 < v["mfu"] <= 1:
            fail(f"{w}: MFU {100 * v['mfu']:.2f}%: a run's MFU is above 0 and at most 100%")
        check_table_cell(w + " tokens/s", c[13], v["tokens_per_s"])
        check_table_cell(w + " final loss", c[14], v["final_loss"])
    print(f"report.md: {len(table_rows)} table rows agree with the metrics files")

    # The physics: measured traffic is the closed form, and every layout learns the same.
    for key, (_, v, _) in runs.items():
        if not close(v["comm_bytes"], v["comm_bytes_closed_form"], rel=1e-9):
            fail(f"{key}: {v['comm_bytes']} bytes per step measured, closed form {v['comm_bytes_closed_form']}")
    ref_key = min(runs, key=lambda k: int(k.split("@")[1]))
    ref = {s["step"]: s["loss"] for s in runs[ref_key][2]}
    worst = 0.0
    for key, (_, _, steps) in runs.items():
        if [s["step"] for s in steps] != sorted(ref):
            fail(f"{key}: steps {[s['step'] for s in steps]} differ from {ref_key}'s")
        for s in steps:
            worst = max(worst, abs(s["loss"] - ref[s["step"]]))
    if worst > 1e-4:
        fail(f"the loss curves differ by {worst:.3g} (more than 1e-4) from {ref_key}'s")
    print(f"traffic equals the closed form in every run; loss curves within {worst:.2g} of {ref_key}'s")

    # The plots: named in report.md, real PNGs of 1000 x 600 pixels, the loss plot drawn in
    # every mode's colour.
    pngs = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", md)
    if len(pngs) != 4:
        fail(f"report.md names {len(pngs)} plots, expected 4 (step time, bytes, memory, loss)")
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
    # inside the plot's axes only (report.py places them at [0.08, 0.1, 0.62, 0.8] of the
    # figure), so that the legend's samples do not count
    h, w = pixels.shape[:2]
    pixels = pixels[int(0.12 * h):int(0.88 * h), int(0.09 * w):int(0.69 * w)]
    for mode in {k.split("@")[0] for k in runs}:
        rgb = MODE_COLORS[mode]
        hits = int(((abs(pixels - rgb).sum(axis=2)) <= 24).sum())
        if hits < 50:
            fail(f"{loss_png}: only {hits} pixels of {mode}'s colour {rgb}: its curve is not drawn")
    print(f"plots: {len(pngs)} PNGs of {PNG_SIZE[0]} x {PNG_SIZE[1]} pixels, valid chunks and image data; "
          "every mode's curve in the loss plot")
    print("PASS: report")


if __name__ == "__main__":
    main()
