#!/usr/bin/env bash
# The small campaign through a real Slurm (docs/perf-runs.md), or a job that meets
# its time limit:
#
#   campaign.sh WORKDIR CUBELM campaign|walltime
#
# Both start a throwaway single-node Slurm (tests/local_slurm.sh: munged, slurmctld
# and slurmd with all their state in a temporary directory, stopped by PID on exit).
#
# campaign:
#   scripts/sweep submits the tiny decks of inputs/perf/tiny/suite (every mode at
#   1-8 ranks, 1D with sequence parallelism too) through sbatch with
#   inputs/perf/cpu.sbatch (srun inside the job), one job at a time; scripts/report
#   writes the report and campaign_check.py checks its numbers against the metrics
#   files and its PNGs.
# walltime:
#   A 2-rank run through mpiexec with --time=1 --signal=B:USR1@25 and at least 45 s
#   of training, paced by the test hook CUBELM_TEST_STEP_PAUSE_MS so that it keeps
#   no core busy: the first job must checkpoint on the signal and exit with status 75
#   before its limit, and the jobs that submit.sh submits again resume from the
#   checkpoints until the run completes.
#
# Exit status 77 (a skip for CTest) when Slurm, munge or numpy/matplotlib are not
# installed or not root; 1 with "FAIL: ..." on a failure; "PASS: <part>" at the end.
set -uo pipefail
work=$1
cubelm=$(realpath "$2")
part=${3:-}
[[ $part == campaign || $part == walltime ]] || { echo "FAIL: campaign.sh: part '$part': expected campaign or walltime"; exit 1; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tests=$root/tests
begin=$(date +%s)
say() { echo "[$(($(date +%s) - begin)) s] $*"; }
fail() {
  echo "FAIL: $*"
  for f in "$work"/*/*/slurm-*.out "$work"/*/*/train.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
  done
  [ -n "${slurm:-}" ] && for f in "$slurm"/log/*.log; do echo "--- $f"; tail -n 15 "$f"; done
  exit 1
}

# shellcheck source=local_slurm.sh
source "$tests/local_slurm.sh"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the local Slurm needs root (slurmd starts jobs as their users)"
  exit 77
fi
missing=$(local_slurm_missing)
if [ -n "$missing" ]; then
  echo "SKIP: no local Slurm here: missing $missing (Debian: apt-get install slurmctld slurmd" \
       "slurm-client munge, which scripts/setup does as root)"
  exit 77
fi
# shellcheck source=../scripts/lib.sh
py=$(source "$root/scripts/lib.sh" && cubelm_python numpy matplotlib) ||
  { echo "SKIP: scripts/report needs Python 3.11 with numpy and matplotlib (scripts/setup installs them)"; exit 77; }

rm -rf "$work"
mkdir -p "$work"
# munge's socket path must stay short: the Slurm state lives in /tmp.
slurm=$(mktemp -d "${TMPDIR:-/tmp}/cubelm-slurm.XXXXXX")
trap 'local_slurm_stop; rm -rf "$slurm"' EXIT
local_slurm_start "$slurm" 8 || fail "the local Slurm did not start"
say "local Slurm up: $(sinfo -h -o '%P %D node(s) %c CPUs %T')"

# The node claims 8 CPUs (2 real cores here): one CPU per task, all tasks on it.
node=(--sbatch-arg=--cpus-per-task=1 --sbatch-arg=--ntasks-per-node=8)

if [ "$part" = campaign ]; then
  # ------------------------------------------------------------------ campaign --
  "$root/scripts/sweep" --launch sbatch "${node[@]}" --sbatch-arg=--time=10 --one-at-a-time \
    --poll 0.5 --timeout 300 --cubelm "$cubelm" -o "$work/campaign" \
    "$root"/inputs/perf/tiny/suite/*.toml >"$work/sweep.log" 2>&1
  sweep_rc=$?
  cat "$work/sweep.log"
  expect=()
  for d in "$work"/campaign/*/; do
    name=$(basename "$d")
    status=$(sed -n 's/.*"status": "\([a-z_]*\)".*/\1/p' "$d/run.json")
    job=$(awk '$2 == "submitted" { print $1 }' "$d/jobs.txt" | tail -n 1)
    [[ $job =~ ^[0-9]+$ ]] && [ -f "$d/slurm-$job.out" ] || fail "$name: no Slurm job recorded (jobs.txt, slurm-JOB.out)"
    [ "$status" = ok ] || fail "$name: status $status (scripts/sweep exit $sweep_rc)"
    grep -q "^=== launch: srun " "$d/train.log" || fail "$name: not launched by srun inside its job"
    mode=$(sed -n 's/.*"mode": "\([a-z0-9+]*\)".*/\1/p' "$d/run.json")
    ranks=$(sed -n 's/.*"ranks": \([0-9]*\).*/\1/p' "$d/run.json")
    expect+=("$mode@$ranks")
  done
  want=$(ls "$root"/inputs/perf/tiny/suite/*.toml | wc -l)
  [ ${#expect[@]} = "$want" ] || fail "${#expect[@]} runs completed (${expect[*]}), expected $want"
  [ "$sweep_rc" = 0 ] || fail "scripts/sweep ended with status $sweep_rc"
  say "campaign: ${#expect[@]} runs through sbatch: ${expect[*]}"

  # -------------------------------------------------------------------- report --
  machine=(--machine "$root/inputs/machines/cpu-node.toml" --cubelm "$cubelm")
  "$root/scripts/report" "$work/campaign" -o "$work/report" "${machine[@]}" || fail "scripts/report failed"
  "$py" "$tests/campaign_check.py" "$work/campaign" "$work/report" "${expect[@]}" "${machine[@]}" ||
    fail "the report does not check"
  say "report checked"
  echo "PASS: campaign"
  exit 0
fi

# ------------------------------------------------------------------ walltime --
# The signal comes between 5 and 35 s after the job starts (slurmctld looks every 30 s).
# 900 steps with a 50 ms pause after each last at least 45 s on any machine, and the
# pause keeps the ranks asleep most of the time; if the machine is slow, more jobs
# continue the run.
steps=900
export CUBELM_TEST_STEP_PAUSE_MS=50
mkdir -p "$work/decks"
cp "$root/inputs/perf/tiny/suite/1d-2.toml" "$work/decks/walltime.toml"
say "walltime: $steps steps, $CUBELM_TEST_STEP_PAUSE_MS ms pause after each, --time=1 --signal=B:USR1@25"
"$root/scripts/sweep" --launch sbatch --launcher mpiexec "${node[@]}" --sbatch-arg=--time=1 \
  --sbatch-arg=--signal=B:USR1@25 --resubmit 30 --steps "$steps" --poll 0.5 --timeout 480 \
  --cubelm "$cubelm" -o "$work/walltime" "$work/decks/walltime.toml" || fail "the walltime run did not complete"
run=$work/walltime/walltime
cat "$run/jobs.txt"
mapfile -t jobs < <(awk '$2 == "submitted" { print $1 }' "$run/jobs.txt")
[ ${#jobs[@]} -ge 2 ] || fail "one job only: the run ended before the signal"
first=${jobs[0]} last=${jobs[-1]}
grep -q "^$first exit 75 " "$run/jobs.txt" || fail "job $first did not stop with status 75"
grep -q "SIGUSR1: passed on to the ranks" "$run/slurm-$first.out" || fail "job $first's shell got no SIGUSR1"
state=$(scontrol show job -o "$first")
[[ $state == *"JobState=FAILED"*"ExitCode=75:0"* ]] || fail "job $first: $(grep -o 'JobState=[A-Z]*\|ExitCode=[0-9:]*' <<<"$state" | tr '\n' ' ')"
runtime=$(grep -o 'RunTime=[0-9:]*' <<<"$state" | cut -d= -f2)
secs=$((10#${runtime:0:2} * 3600 + 10#${runtime:3:2} * 60 + 10#${runtime:6:2}))
[ "$secs" -lt 60 ] || fail "job $first ran $runtime, not less than its 1-minute limit"
stop=$(grep -o "stopped early after step [0-9]* of $steps (SIGUSR1 on 2 ranks)" "$run/train.log" | sed -n 1p)
[ -n "$stop" ] || fail "no stop line naming SIGUSR1 in train.log"
k=$(sed 's/stopped early after step \([0-9]*\).*/\1/' <<<"$stop")
ckpt=$(printf "checkpoints/step_%08d.h5" $((k + 1)))
grep -q "^resumed from $ckpt after step $((k + 1))" "$run/train.log" || fail "the second job did not resume from $ckpt"
grep -q "^$last exit 0 " "$run/jobs.txt" || fail "the last job $last did not complete"
[[ $(scontrol show job -o "$last") == *"JobState=COMPLETED"* ]] || fail "job $last is not COMPLETED"
"$py" - "$run/metrics.jsonl" "$steps" <<'EOF' || fail "the metrics of the resumed run are not each step once"
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1])]
assert steps == list(range(int(sys.argv[2]))), f"{len(steps)} lines, steps {steps[:3]}...{steps[-3:]}"
EOF
"$cubelm" verify "$(printf "%s/checkpoints/step_%08d.h5" "$run" "$steps")" >/dev/null || fail "the final checkpoint does not verify"
say "walltime: job $first stopped on SIGUSR1 after step $k in $runtime (limit 1 min, exit 75);" \
    "${#jobs[@]} jobs in all, the last ($last) completed step $steps; metrics hold each step once"
grep -q "^test hook: pausing 50 ms after every step" "$run/train.log" || fail "the run did not pause between steps"
echo "PASS: walltime"
