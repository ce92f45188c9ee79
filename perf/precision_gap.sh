#!/usr/bin/env bash
# bf16 against fp32, side by side: each deck trained twice (train.precision fp32, then
# bf16) from the same seed, and the largest relative gap between the two loss curves at
# any step printed per deck (docs/precision.md, "Measured on a CPU").
#   perf/precision_gap.sh quickstart [STEPS]   the quick start (default 200 steps) in
#                                              nine layouts, 1 to 8 ranks
#   perf/precision_gap.sh campaign [DIR]       every deck of a campaign set (default
#                                              inputs/perf/small/workstation); the rank
#                                              count is the file name's last field
# Environment: CUBELM (the program; default build/cpu/src/cubelm), CUBELM_PYTHON,
# WORK (where the decks, logs and metrics go; default a new directory under /tmp).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/lib.sh"
cubelm_mpi_env
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
bin=${CUBELM:-$root/build/cpu/src/cubelm}
python=${CUBELM_PYTHON:-python3}
[ -x "$bin" ] || { echo "perf/precision_gap.sh: no program at $bin (build it, or set CUBELM)" >&2; exit 1; }
what=${1:-}
work=${WORK:-$(mktemp -d /tmp/cubelm-precision-gap.XXXXXX)}
mkdir -p "$work"

# deck NAME PRECISION SOURCE STEPS PARALLEL: SOURCE with the precision, the steps (unless
# empty), a loss every step into NAME_PRECISION.jsonl, a checkpoint directory of its
# own (never resumed from), and the [parallel] table replaced by PARALLEL (unless empty).
deck() {
  local name=$1 p=$2 src=$3 steps=$4 par=$5
  awk -v p="$p" -v steps="$steps" -v par="$par" -v m="${name}_$p" '
    /^\[/ { skip = 0 }
    /^\[parallel\]/ && par != "" { print; print par; skip = 1; next }
    skip { next }
    /^\[train\]/ { print; print "precision = \"" p "\""; next }
    /^precision *=/ { next }
    /^steps *=/ && steps != "" { print "steps = " steps; next }
    /^\[log\]/ { print; print "interval = 1"; print "metrics = \"" m ".jsonl\""; next }
    /^(interval|metrics) *=/ { next }
    /^\[checkpoint\]/ { print; ck(); seen = 1; next }
    /^(dir|resume) *=/ { next }
    { print }
    END { if (!seen) { print "[checkpoint]"; ck() } }
    function ck() { print "dir = \"ck_" m "\""; print "resume = \"none\"" }' "$src" >"$work/${name}_$p.toml"
}

# run NAME RANKS: both precisions, then the gap.
run() {
  local name=$1 n=$2 p
  for p in fp32 bf16; do
    rm -rf "$work/ck_${name}_$p" "$work/${name}_$p.jsonl"
    (cd "$work" && mpiexec --oversubscribe -n "$n" "$bin" train "${name}_$p.toml") >"$work/${name}_$p.log" 2>&1 ||
      { tail -n 5 "$work/${name}_$p.log" >&2; echo "perf/precision_gap.sh: $name ($p) failed (log: $work/${name}_$p.log)" >&2; exit 1; }
  done
  "$python" - "$work/${name}_fp32.jsonl" "$work/${name}_bf16.jsonl" "$name" "$n" <<'EOF'
import json, sys
def losses(path):
    rows = (json.loads(line) for line in open(path))
    return {r["step"]: r["loss"] for r in rows if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
steps = sorted(set(a) & set(b))
gap, at = max((abs(b[s] - a[s]) / a[s], s) for s in steps)
last = steps[-1]
print(f"{sys.argv[3]:10s} {sys.argv[4]:>5s} {len(steps):6d} {gap:10.2e} {at:6d} {a[last]:10.4f} {b[last]:10.4f}")
EOF
}

echo "deck       ranks  steps   max gap at step final fp32 final bf16"
case "$what" in
  quickstart)
    steps=${2:-200}
    layouts=(
      'none-1|tensor_mode = "none"|1'
      '1d-2|tensor_mode = "1d"\ntensor_size = 2|2'
      '1d-4|tensor_mode = "1d"\ntensor_size = 4|4'
      '1dsp-4|tensor_mode = "1d"\ntensor_size = 4\nsequence_parallel = true|4'
      '2d-4|tensor_mode = "2d"\ntensor_size = 4|4'
      '3d-8|tensor_mode = "3d"\ntensor_size = 8|8'
      'pp2-1f1b|pipeline_size = 2\nmicrobatches = 4|2'
      'dp4-zero|data_size = 4\nzero = 1|4'
      'cp-2|context_size = 2|2'
    )
    for l in "${layouts[@]}"; do
      IFS='|' read -r name par n <<<"$l"
      for p in fp32 bf16; do deck "$name" "$p" "$root/inputs/quickstart.toml" "$steps" "$(printf '%b' "$par")"; done
      run "$name" "$n"
    done
    ;;
  campaign)
    dir=${2:-$root/inputs/perf/small/workstation}
    for d in "$dir"/*.toml; do
      name=$(basename "$d" .toml)
      n=${name##*-}
      [[ "$n" =~ ^[0-9]+$ ]] || { echo "perf/precision_gap.sh: $d: no rank count at the end of its name" >&2; exit 2; }
      for p in fp32 bf16; do deck "$name" "$p" "$d" "" ""; done
      run "$name" "$n"
    done
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
echo "(decks, logs and metrics in $work)"
