"""Runs or submits one job per deck and collects each run in a directory of its own.

    scripts/sweep [options] -o OUT DECK...

For each deck, OUT/<deck name>/ becomes a run directory (docs/perf-runs.md;
with --repeat N, OUT/<deck name>.r1 .. .rN, one per repeat of the same deck):
deck.toml (the deck with the run's metrics, checkpoint and data settings),
run.json, and once it ran check.json, metrics.jsonl, train.log and jobs.txt;
with --launch sbatch also submit.sh (which submits the run again) and
job.sbatch (the batch script). Running the same sweep again continues: runs
that completed are skipped, the others resume from their newest checkpoint.
Exit status 0 when every run completed, 1 otherwise, 2 for bad arguments.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

from common import (ROOT, UserError, deck_text, layout_text, load_deck, main_guard, mode_of,
                    model_text, read_json, world_of, write_json)

JOB_SH = os.path.join(ROOT, "scripts", "perf", "job.sh")
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "STAGE_OUT", "SIGNALING", "RESV_DEL_HOLD"}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/sweep", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("decks", nargs="+", metavar="DECK", help="decks to run (e.g. inputs/perf/tiny/suite/*.toml)")
    p.add_argument("-o", dest="out", required=True, help="the campaign directory: one run directory per deck")
    p.add_argument("--campaign", help="the campaign's name in the report (default: OUT's name)")
    p.add_argument("--launch", choices=("local", "sbatch"), default="local",
                   help="run here, one run after the other (default), or submit to Slurm")
    p.add_argument("--script", default=os.path.join(ROOT, "inputs", "perf", "cpu.sbatch"),
                   help="batch script for --launch sbatch (default: inputs/perf/cpu.sbatch; "
                        "inputs/perf/gpu.sbatch for GPU nodes)")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="one more sbatch option (repeat it), e.g. --sbatch-arg=--partition=gpu")
    p.add_argument("--launcher", choices=("srun", "mpiexec"),
                   help="launcher inside the job (default: the batch script's, srun)")
    p.add_argument("--cubelm", help="the cubelm program (default: $CUBELM, else build/cpu/src/cubelm; "
                                    "gpu.sbatch defaults to build/cuda/src/cubelm)")
    p.add_argument("--data", metavar="FILE.bin",
                   help="train every deck on this llm.c token file instead of its own data")
    p.add_argument("--steps", type=int, help="train.steps of every deck")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run every deck N times, in run directories NAME.r1 .. NAME.rN (default 1: NAME)")
    p.add_argument("--resubmit", type=int, default=0, metavar="N",
                   help="continue a run stopped before its time limit (exit status 75) in a new job, "
                        "at most N times (default 0)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="sbatch: the jobs of the sweep run one after the other (--dependency=singleton)")
    p.add_argument("--no-wait", action="store_true", help="sbatch: submit and return")
    p.add_argument("--poll", type=float, default=5.0, metavar="S", help="seconds between job queries (default 5)")
    p.add_argument("--timeout", type=float, default=0, metavar="S",
                   help="stop waiting after S seconds (default: no limit); the jobs go on")
    p.add_argument("--dry-run", action="store_true",
                   help="write the run directories and print what would run, run nothing")
    a = p.parse_args(argv)
    if a.steps is not None and a.steps < 0:
        raise UserError(f"--steps {a.steps}: the number of steps is at least 0")
    if a.repeat < 1:
        raise UserError(f"--repeat {a.repeat}: at least 1")
    if a.resubmit < 0:
        raise UserError(f"--resubmit {a.resubmit}: at least 0")
    if a.poll <= 0:
        raise UserError(f"--poll {a.poll}: a positive number of seconds")
    if a.launch == "local" and (a.sbatch_arg or a.one_at_a_time or a.no_wait or a.launcher):
        raise UserError("--sbatch-arg, --launcher, --one-at-a-time and --no-wait go with --launch sbatch")
    return a


def run_name(path):
    return os.path.splitext(os.path.basename(path))[0]


def prepare(args):
    """Reads and checks every deck; returns [(run name, source, deck, repeat fields)]."""
    runs, seen = [], {}
    if args.data:
        if not os.path.isfile(args.data):
            raise UserError(f"--data {args.data}: no such file")
        with open(args.data, "rb") as f:
            magic = int.from_bytes(f.read(4), "little")
        if magic != 20240520:
            raise UserError(f"--data {args.data}: not an llm.c token file (magic {magic}, "
                            "expected 20240520; `cubelm data` makes one from text)")
    for path in args.decks:
        deck = load_deck(path)
        mode_of(deck, path)
        name = run_name(path)
        if name in seen:
            raise UserError(f"{path}: a run named '{name}' comes from {seen[name]} already: "
                            "run decks of the same name in separate sweeps (-o)")
        seen[name] = path
        deck.setdefault("checkpoint", {}).update(dir="checkpoints", resume="auto")
        deck.setdefault("log", {})["metrics"] = "metrics.jsonl"
        if args.steps is not None:
            deck.setdefault("train", {})["steps"] = args.steps
        if args.data:
            deck["data"] = {k: v for k, v in deck.get("data", {}).items()
                            if k not in ("format", "path", "synthetic_tokens", "synthetic_branching")}
            deck["data"].update(format="llmc", path=os.path.abspath(args.data))
        elif deck.get("data", {}).get("path"):
            # cubelm reads a relative path from the directory it runs in: here, as the
            # user wrote it, not the run directory the job trains in.
            deck["data"]["path"] = os.path.abspath(deck["data"]["path"])
        for k in range(1, args.repeat + 1):
            # The same deck again: each repeat trains in a run directory of its own.
            runs.append((name if args.repeat == 1 else f"{name}.r{k}", os.path.abspath(path), deck,
                         dict(point=name, repeat=k, repeats=args.repeat)))
    return runs


def write_run_dir(args, out, campaign, name, source, deck, repeat):
    """Creates or checks OUT/name; returns (run dir, run.json dict)."""
    d = os.path.join(out, name)
    text = deck_text(deck, f"Run deck of {source}\nwritten by scripts/sweep (docs/perf-runs.md)")
    deck_path = os.path.join(d, "deck.toml")
    if os.path.exists(deck_path):
        with open(deck_path) as f:
            if f.read() != text:
                raise UserError(f"{d} holds a run of another deck (its deck.toml differs from what "
                                f"{source} gives now): choose another -o, or remove {d}")
        info = read_json(os.path.join(d, "run.json"))
    else:
        os.makedirs(d, exist_ok=True)
        with open(deck_path, "w") as f:
            f.write(text)
        p = deck.get("parallel", {})
        info = dict(campaign=campaign, name=name, source=source, mode=mode_of(deck),
                    ranks=world_of(deck), layout=layout_text(deck), model=model_text(deck),
                    tensor_size=p.get("tensor_size", 1), pipeline_size=p.get("pipeline_size", 1),
                    data_size=p.get("data_size", 1), status="prepared", jobs=[], **repeat)
    info.update(launch=args.launch,
                cubelm=os.path.abspath(args.cubelm) if args.cubelm else os.environ.get("CUBELM", ""))
    write_json(os.path.join(d, "run.json"), info)
    return d, info


# ------------------------------------------------------------------ local --
def run_local(args, d, info):
    env = dict(os.environ, CUBELM_ROOT=ROOT, CUBELM_RANKS=str(info["ranks"]))
    if args.cubelm:
        env["CUBELM"] = os.path.abspath(args.cubelm)
    tries = 0
    while True:
        start = time.time()
        with open(os.path.join(d, "local.out"), "a") as log:
            rc = subprocess.call(["bash", JOB_SH], cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT)
        info["jobs"].append(dict(id="local", exit=rc, seconds=round(time.time() - start, 1)))
        if rc == 75 and tries < args.resubmit:
            tries += 1
            continue
        info["status"] = "ok" if rc == 0 else "stopped" if rc == 75 else "failed"
        info["detail"] = f"exit status {rc}"
        write_json(os.path.join(d, "run.json"), info)
        return


# ----------------------------------------------------------------- sbatch --
def write_submit(args, d, info, campaign):
    script = os.path.abspath(args.script)
    if not os.path.isfile(script):
        raise UserError(f"--script {args.script}: no such batch script")
    shutil.copyfile(script, os.path.join(d, "job.sbatch"))
    env = {"CUBELM_ROOT": ROOT}
    if args.cubelm:
        env["CUBELM"] = os.path.abspath(args.cubelm)
    elif os.environ.get("CUBELM"):
        env["CUBELM"] = os.environ["CUBELM"]
    if args.launcher:
        env["CUBELM_LAUNCHER"] = args.launcher
    name = f"cubelm-{campaign}" if args.one_at_a_time else f"cubelm-{campaign}-{info['name']}"
    sbatch = ["sbatch", "--parsable", f"--job-name={name}", '--chdir="$PWD"',
              '--output="$PWD/slurm-%j.out"', f"--ntasks={info['ranks']}"]
    if args.one_at_a_time:
        sbatch.append("--dependency=singleton")
    sbatch += [shlex.quote(a) for a in args.sbatch_arg] + ["job.sbatch"]
    lines = ["#!/usr/bin/env bash",
             "# Submits this run directory's job (written by scripts/sweep, docs/perf-runs.md).",
             "# Running it again continues the run from its newest checkpoint.",
             "set -euo pipefail",
             'cd "$(dirname "$0")"',
             "# A job submitted from inside a job must not inherit that job's settings.",
             'for v in $(compgen -v SLURM_); do [ "$v" = SLURM_CONF ] || unset "$v"; done',
             "unset CUBELM_END_TIME OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES OMPI_MCA_mpi_yield_when_idle",
             "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()),
             f"export CUBELM_RESUBMIT=${{CUBELM_RESUBMIT:-{args.resubmit}}}",
             "id=$(" + " ".join(sbatch) + ")",
             'echo "${id%%;*} submitted $(date +%s)" >>jobs.txt',
             'echo "${id%%;*}"', ""]
    path = os.path.join(d, "submit.sh")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    os.chmod(path, 0o755)
    return path


def submit(d, info):
    r = subprocess.run(["./submit.sh"], cwd=d, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise UserError(f"{d}/submit.sh failed (exit status {r.returncode}): "
                        f"{(r.stderr or r.stdout).strip()}")
    job = r.stdout.strip().splitlines()[-1]
    info["status"] = "submitted"
    write_json(os.path.join(d, "run.json"), info)
    return job


def job_events(d):
    """jobs.txt as {'submitted': [ids in order], 'exit': {id: status}}."""
    events = {"submitted": [], "exit": {}}
    try:
        with open(os.path.join(d, "jobs.txt")) as f:
            for line in f:
                w = line.split()
                if len(w) >= 2 and w[1] == "submitted":
                    events["submitted"].append(w[0])
                elif len(w) >= 3 and w[1] == "exit":
                    events["exit"][w[0]] = int(w[2])
    except FileNotFoundError:
        pass
    return events


def job_state(job):
    """(state, exit code) from scontrol, or None when Slurm no longer knows the job."""
    try:
        r = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        return ("UNKNOWN", "")
    if r.returncode != 0:
        return None
    fields = dict(w.split("=", 1) for w in r.stdout.split() if "=" in w)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "")


def settle(d, info):
    """Updates info from the run's jobs; returns True when the run has ended."""
    ev = job_events(d)
    if not ev["submitted"]:
        info.update(status="failed", detail="never submitted")
        return True
    job = ev["submitted"][-1]
    st = job_state(job)
    if st is None:  # purged from Slurm's memory: job.sh's record is all there is
        if job not in ev["exit"]:
            info.update(status="failed", detail=f"job {job}: unknown to Slurm and no exit recorded")
            return True
        st = ("COMPLETED" if ev["exit"][job] == 0 else "FAILED", f"{ev['exit'][job]}:0")
    state, code = st
    if state in ACTIVE or state == "UNKNOWN":
        info["status"] = state.lower()
        return False
    # A job that stopped before its limit and resubmitted itself: the next line names the new job.
    if job_events(d)["submitted"][-1] != job:
        return False
    info["jobs"] = [dict(id=j, exit=ev["exit"].get(j)) for j in ev["submitted"]]
    rc = ev["exit"].get(job)
    if state == "COMPLETED":
        info.update(status="ok", detail=f"job {job} COMPLETED")
    elif rc == 75:
        info.update(status="stopped", detail=f"job {job} stopped before its time limit with a "
                                             "checkpoint (exit 75): run submit.sh to continue")
    else:
        info.update(status="failed", detail=f"job {job} {state} ExitCode={code}")
    return True


def wait(args, runs):
    start = time.time()
    pending = list(runs)
    while pending:
        still = []
        for d, info in pending:
            if settle(d, info):
                write_json(os.path.join(d, "run.json"), info)
                print(f"scripts/sweep: {info['name']}: {info['status']} ({info['detail']})", flush=True)
            else:
                still.append((d, info))
        pending = still
        if pending and args.timeout and time.time() - start > args.timeout:
            names = ", ".join(i["name"] for _, i in pending)
            print(f"scripts/sweep: stopped waiting after {args.timeout:g} s; still running: {names} "
                  "(run the same command again to wait for them)", file=sys.stderr)
            return False
        if pending:
            time.sleep(args.poll)
    return True


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    runs = prepare(args)
    out = os.path.abspath(args.out)
    campaign = args.campaign or os.path.basename(out.rstrip("/"))
    if args.launch == "sbatch" and not args.dry_run and shutil.which("sbatch") is None:
        raise UserError("--launch sbatch: no sbatch command here (Slurm's client is not installed "
                        "or not on PATH)")
    if args.cubelm and not os.access(args.cubelm, os.X_OK):
        raise UserError(f"--cubelm {args.cubelm}: not an executable program")
    os.makedirs(out, exist_ok=True)
    todo, done = [], 0
    for name, source, deck, repeat in runs:
        d, info = write_run_dir(args, out, campaign, name, source, deck, repeat)
        if info["status"] == "ok":
            done += 1
            print(f"scripts/sweep: {name}: completed before, skipped")
            continue
        todo.append((d, info))
    print(f"scripts/sweep: campaign '{campaign}' in {out}: {len(todo)} run(s) to go, {done} done",
          flush=True)
    if args.launch == "local":
        for d, info in todo:
            if args.dry_run:
                print(f"  (cd {d} && bash {JOB_SH})")
                continue
            print(f"scripts/sweep: {info['name']}: {info['ranks']} rank(s), {info['layout']} ...",
                  end="", flush=True)
            t = time.time()
            run_local(args, d, info)
            print(f" {info['status']} ({info['detail']}, {time.time() - t:.0f} s)", flush=True)
    else:
        submitted = []
        for d, info in todo:
            if info["status"] in ("submitted",) or info["status"].lower() in {s.lower() for s in ACTIVE}:
                ev = job_events(d)
                st = job_state(ev["submitted"][-1]) if ev["submitted"] else None
                if st and st[0] in ACTIVE:
                    print(f"scripts/sweep: {info['name']}: job {ev['submitted'][-1]} is {st[0]}, waiting for it")
                    submitted.append((d, info))
                    continue
            path = write_submit(args, d, info, campaign)
            if args.dry_run:
                print(f"  {path}")
                continue
            job = submit(d, info)
            print(f"scripts/sweep: {info['name']}: {info['ranks']} rank(s), {info['layout']}: job {job}",
                  flush=True)
            submitted.append((d, info))
        if args.dry_run or args.no_wait:
            return 0
        if not wait(args, submitted):
            return 1
    if args.dry_run:
        return 0
    bad = [info for _, info in todo if info["status"] != "ok"]
    for info in bad:
        print(f"scripts/sweep: {info['name']}: {info['status']}: {info.get('detail', '')} "
              f"(see {os.path.join(out, info['name'], 'train.log')})")
    print(f"scripts/sweep: {len(runs) - len(bad)} of {len(runs)} run(s) completed in {out}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    main_guard("scripts/sweep", main)
