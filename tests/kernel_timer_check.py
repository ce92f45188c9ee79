"""A real cubelm run with libcubelm_kernel_timer loaded as Kokkos loads a tool.

    kernel_timer_check.py WORKDIR LIBRARY SOURCE_ROOT -- PROGRAM ARGS...

Runs the program in WORKDIR with KOKKOS_PROFILE_LIBRARY (Kokkos 3.4) and
KOKKOS_TOOLS_LIBS (Kokkos 4 and later) naming LIBRARY, then checks what the
library wrote: one table and one JSON file for the process (named by its rank or
pid), kernels with calls and times, the labels of cubelm's kernels as the sources
spell them, and kernel times that add up to no more than the run's wall time,
measured here around the whole process. Prints "PASS: kernel timer" at the end,
"FAIL: ..." on the first failure.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

# Kernels that every dense training step launches (LayerNorm, attention, GELU, the
# loss and AdamW): a rename in src/kernels must be made here too, which the check of
# the sources below reports. A tuple is one of its names: the loss runs in one kernel
# where a rank holds the whole vocabulary, in three otherwise. Attention runs on blocks
# of the sequence (softmax rows of a block pair between batched products).
REQUIRED = [
    "cubelm::layernorm_normalize",
    "cubelm::attention_block_softmax",
    "cubelm::attention_block_softmax_backward",
    "cubelm::gelu_forward",
    ("cubelm::cross_entropy_rows", "cubelm::vocab_cross_entropy"),
    "cubelm::adamw_chunks",
]
# The regions around the products (src/kernels/gemm_detail.hpp): BLAS is no kernel.
# The batched products' region: attention's block products.
REQUIRED_REGIONS = ["cubelm::gemm", "cubelm::gemm_batched"]


def alternatives(entry):
    return entry if isinstance(entry, tuple) else (entry,)


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def source_labels(root):
    """Every "cubelm::name" string literal in src/, the labels cubelm gives Kokkos."""
    labels = set()
    for path in (root / "src").rglob("*.[ch]pp"):
        labels.update(re.findall(r'"(cubelm::[A-Za-z0-9_]+)"', path.read_text()))
    return labels


def one_file(work, stem, suffix):
    found = sorted(work.glob(stem + ".*"))
    if [p.name for p in found] != [f"{stem}.{suffix}"]:
        fail(f"expected exactly {stem}.{suffix} in {work}, found {[p.name for p in found]}")
    return found[0]


def main():
    if len(sys.argv) < 6 or sys.argv[4] != "--":
        fail("usage: kernel_timer_check.py WORKDIR LIBRARY SOURCE_ROOT -- PROGRAM ARGS...")
    work = pathlib.Path(sys.argv[1])
    library = str(pathlib.Path(sys.argv[2]).resolve())
    root = pathlib.Path(sys.argv[3])
    command = sys.argv[5:]

    labels = source_labels(root)
    missing = [name for entry in REQUIRED for name in alternatives(entry) if name not in labels]
    if missing:
        fail(f"src/ no longer names the kernels {missing}: update REQUIRED in {sys.argv[0]}")

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(os.environ)
    env.update(
        KOKKOS_PROFILE_LIBRARY=library,
        KOKKOS_TOOLS_LIBS=library,
        CUBELM_KERNEL_TIMER_OUT=str(work / "table.txt"),
        CUBELM_KERNEL_TIMER_JSON=str(work / "figures.json"),
        CUBELM_KERNEL_TIMER_TOP="10",
    )
    env.pop("CUBELM_KERNEL_TIMER_FENCE", None)
    start = time.monotonic()
    run = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    output = run.stdout + run.stderr
    print(output, end="")
    if run.returncode != 0:
        fail(f"{' '.join(command)} exited with status {run.returncode}")
    if "Unable to load KokkosP library" in output:
        fail("Kokkos could not load the library (above)")

    # One file per process, named by its rank (from the launcher's environment, or
    # the one MPI's start-up sets in the process) or else by its pid.
    json_files = sorted(work.glob("figures.json.*"))
    if len(json_files) != 1:
        fail(f"expected one figures.json.* in {work}, found {[p.name for p in json_files]}")
    figures = json.loads(json_files[0].read_text())
    launcher_rank = next(
        (os.environ[v] for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
         if os.environ.get(v)), None)
    if launcher_rank is not None and figures["rank"] != launcher_rank:
        fail(f"rank {figures['rank']} in the JSON, {launcher_rank} in the environment")
    suffix = figures["rank"] if figures["rank"] is not None else str(figures["pid"])
    one_file(work, "figures.json", suffix)
    table = one_file(work, "table.txt", suffix).read_text()

    if figures["finalized"] is not True or figures["fencing"] != "requested":
        fail(f"finalized {figures['finalized']}, fencing {figures['fencing']}: expected true, "
             "requested (Kokkos 3.4 or later calls both hooks)")
    kernels = figures["kernels"]
    if not kernels:
        fail("no kernels in the JSON")
    for k in kernels:
        if k["calls"] <= 0 or k["total_s"] <= 0:
            fail(f"kernel without calls or time: {k}")
        if not k["min_s"] <= k["mean_s"] <= k["max_s"] or \
                abs(k["mean_s"] * k["calls"] - k["total_s"]) > 1e-6 * max(1.0, k["total_s"]):
            fail(f"min <= mean <= max and mean x calls = total do not hold: {k}")
    names = {k["name"] for k in kernels}
    absent = [entry for entry in REQUIRED if not any(n in names for n in alternatives(entry))]
    if absent:
        fail(f"kernels {absent} not timed; the JSON has {sorted(names)}")
    unknown = sorted(n for n in names if n.startswith("cubelm::") and n not in labels)
    if unknown:
        fail(f"kernels {unknown} are not labels of src/ (names garbled?)")

    regions = {r["name"]: r for r in figures["regions"] if r["kind"] == "region"}
    for name in REQUIRED_REGIONS:
        if name not in regions or regions[name]["calls"] <= 0:
            fail(f"no region {name}; the JSON has {sorted(regions)}")

    total = sum(k["total_s"] for k in kernels)
    if abs(total - figures["kernel_total_s"]) > 1e-6:
        fail(f"kernel_total_s {figures['kernel_total_s']} is not the sum of the kernels {total}")
    if not total <= figures["wall_s"] <= wall:
        fail(f"kernel time {total:.4f} s, the library's run time {figures['wall_s']:.4f} s and "
             f"the process's wall time {wall:.4f} s are not in increasing order")
    calls = sum(k["calls"] for k in kernels)

    # The table: the header, and the kernel with the most time in the first row.
    if not table.startswith("cubelm kernel timer: ") or "Kokkos fences" not in table:
        fail(f"the table's header is not as expected:\n{table}")
    header = f"kernels: {calls} launches of {len(kernels)} kernels"
    if header not in table:
        fail(f"the table does not say '{header}':\n{table}")
    first = table.split("share  name\n", 1)[1].splitlines()[0]
    if not first.endswith("  " + kernels[0]["name"]):
        fail(f"the first row is not {kernels[0]['name']}: {first}")

    print(table, end="")
    print(f"kernel timer: {len(kernels)} kernels, {calls} launches, {total:.3f} s of "
          f"{wall:.3f} s; {len(figures['regions'])} regions, copies and fences")
    print("PASS: kernel timer")


if __name__ == "__main__":
    main()
