#!/usr/bin/env bash
# The campaign tools without Slurm (docs/perf-runs.md):
#
#   perf_tools.sh WORKDIR CUBELM CASE
#
# CASE:
#   decks    inputs/perf is what scripts/perf-decks writes, `cubelm check` accepts
#            every deck, and the batch scripts parse
#   local    scripts/sweep --launch local runs two tiny decks here (one on an llm.c
#            token file given with --data), skips them when run again, and
#            scripts/report reports them
#   errors   bad input to scripts/report and scripts/sweep: each is refused with exit
#            status 2 and a message naming the file or argument and the rule
# Prints "PASS: CASE" at the end, "FAIL: ..." on the first failure.
set -uo pipefail
work=$1
cubelm=$(realpath "$2")
case=$3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
export CUBELM=$cubelm

# expect_error MESSAGE-REGEX COMMAND...: the command fails with status 2 and says MESSAGE
expect_error() {
  local want=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" = 2 ] || fail "exit status $rc (expected 2) from: $* -- $out"
  grep -qE -- "$want" <<<"$out" || fail "no message /$want/ from: $* -- it said: $out"
  echo "refused as expected: ${out##*error: }"
}

rm -rf "$work"
mkdir -p "$work"
case $case in
decks)
  "$root/scripts/perf-decks" -o "$work/decks" >/dev/null || fail "scripts/perf-decks failed"
  list() { (cd "$1" && find . -name "*.toml" -o -name README.md | sed "s,^\./,," | sort); }
  [ "$(list "$root/inputs/perf")" = "$(list "$work/decks")" ] ||
    fail "inputs/perf holds other decks than scripts/perf-decks writes: $(diff <(list "$root/inputs/perf") <(list "$work/decks") | sed -n 1,5p)"
  n=0
  while read -r f; do
    cmp -s "$root/inputs/perf/$f" "$work/decks/$f" || fail "inputs/perf/$f differs from what scripts/perf-decks writes (run it)"
    n=$((n + 1))
  done < <(list "$work/decks")
  echo "inputs/perf: $n files as scripts/perf-decks writes them"
  # One `cubelm check --json` per deck, 8 at a time (each mostly waits for MPI's start-up):
  # a valid deck whose inputs can be used. Whether it fits is for its target machine
  # (its exit status says for this one).
  list "$work/decks" | grep 'toml$' |
    xargs -P 8 -I{} sh -c 'OMP_NUM_THREADS=1 "$0" check --json "$1/{}" >"$2/{}.json" 2>"$2/{}.err"
      grep -q "\"problems\": \[\]" "$2/{}.json" || echo "{}"' \
      "$cubelm" "$root/inputs/perf" "$work/decks" >"$work/refused.txt"
  while read -r f; do
    echo "cubelm check refuses inputs/perf/$f: $(tail -n 1 "$work/decks/$f.err")"
  done <"$work/refused.txt"
  [ ! -s "$work/refused.txt" ] || fail "cubelm check refuses $(wc -l <"$work/refused.txt") deck(s) of inputs/perf (above)"
  echo "cubelm check: all $((n - 1)) decks valid"
  for f in inputs/perf/cpu.sbatch inputs/perf/gpu.sbatch scripts/perf/job.sh; do
    bash -n "$root/$f" || fail "$f: bash finds a syntax error"
  done
  grep -q "^#SBATCH --gpus-per-node=4$" "$root/inputs/perf/gpu.sbatch" &&
    [ "$(grep -c "^#SBATCH --ntasks-per-node=4$" "$root/inputs/perf/gpu.sbatch")" = 1 ] ||
    fail "gpu.sbatch: not one rank per GPU"
  ;;
local)
  decks=("$root/inputs/perf/tiny/suite/none-1.toml" "$root/inputs/perf/tiny/suite/1d-2.toml")
  "$root/scripts/sweep" --steps 4 -o "$work/runs" "${decks[@]}" || fail "scripts/sweep --launch local failed"
  for r in none-1 1d-2; do
    for f in deck.toml run.json check.json metrics.jsonl train.log jobs.txt; do
      [ -s "$work/runs/$r/$f" ] || fail "$r: no $f"
    done
    [ "$(wc -l <"$work/runs/$r/metrics.jsonl")" = 4 ] || fail "$r: not 4 steps in metrics.jsonl"
    grep -q '"status": "ok"' "$work/runs/$r/run.json" || fail "$r: run.json does not say ok"
  done
  grep -q "^=== launch: mpiexec -n 2 " "$work/runs/1d-2/train.log" || fail "1d-2 was not launched with mpiexec -n 2"
  again=$("$root/scripts/sweep" --steps 4 -o "$work/runs" "${decks[@]}") || fail "the second sweep failed"
  [ "$(grep -c "completed before, skipped" <<<"$again")" = 2 ] || fail "the second sweep ran again: $again"
  # An llm.c token file for every deck of a sweep.
  "$cubelm" data "$root/README.md" "$root/docs/perf-runs.md" -o "$work/text.bin" >/dev/null || fail "cubelm data failed"
  "$root/scripts/sweep" --steps 3 --data "$work/text.bin" -o "$work/llmc" "${decks[1]}" || fail "the sweep on an llm.c file failed"
  grep -q "^format = \"llmc\"" "$work/llmc/1d-2/deck.toml" && grep -q "^path = \"$work/text.bin\"" "$work/llmc/1d-2/deck.toml" ||
    fail "the run deck does not read the llm.c file"
  # --repeat 2: two run directories of the same deck, each with its repeat in run.json.
  "$root/scripts/sweep" --steps 3 --repeat 2 --dry-run -o "$work/rep" "${decks[0]}" >/dev/null ||
    fail "scripts/sweep --repeat 2 --dry-run failed"
  for k in 1 2; do
    f=$work/rep/none-1.r$k/run.json
    [ -f "$f" ] && grep -q '"point": "none-1"' "$f" && grep -q "\"repeat\": $k," "$f" &&
      grep -q '"repeats": 2' "$f" || fail "no run directory none-1.r$k with its repeat: $(ls "$work/rep")"
  done
  cmp -s "$work/rep/none-1.r1/deck.toml" "$work/rep/none-1.r2/deck.toml" || fail "the repeats' decks differ"
  # ... run, and reported as one point a deck: its median run, [lowest-highest] beside;
  # campaign_check.py computes the report again from the metrics.
  "$root/scripts/sweep" --steps 3 --repeat 2 -o "$work/rep" "${decks[@]}" >"$work/rep.out" 2>&1 ||
    fail "the repeats failed: $(tail -3 "$work/rep.out")"
  "$root/scripts/report" "$work/rep" -o "$work/rep-report" >/dev/null || fail "scripts/report of repeats failed"
  py=$(source "$root/scripts/lib.sh" && cubelm_python numpy matplotlib) || fail "no Python with numpy and matplotlib"
  "$py" "$root/tests/campaign_check.py" "$work/rep" "$work/rep-report" none@1 1d@2 ||
    fail "the report of the repeats does not check"
  grep -q "^## rep: .*, 3 steps (1 warm-up), 2 repeats, on [^ ]*: .*, [0-9]* CPUs$" "$work/rep-report/report.md" ||
    fail "the repeats' section title names no steps, repeats or machine: $(grep '^## rep' "$work/rep-report/report.md")"
  [ "$(grep -c '^| none | 1 | 1 rank | [0-9.]* \[[0-9.]*-[0-9.]*\] |' "$work/rep-report/report.md")" = 1 ] ||
    fail "not one table row with the repeats' spread: $(grep '^| none' "$work/rep-report/report.md")"
  [ "$(tr -d '\r' <"$work/rep-report/report.csv" | grep -c ',none-1,[12]$')" = 2 ] || fail "report.csv has not one row per repeat"
  # A deck's own relative data.path is read from where the sweep runs, as cubelm would.
  sed -e '/^\[data\]/,$d' "${decks[1]}" >"$work/rel.toml"
  printf '[data]\nformat = "llmc"\npath = "text.bin"\n' >>"$work/rel.toml"
  (cd "$work" && "$root/scripts/sweep" --steps 1 -o "$work/rel" "$work/rel.toml" >/dev/null) ||
    fail "the sweep of a deck with a relative data.path failed"
  grep -q "^path = \"$work/text.bin\"" "$work/rel/rel/deck.toml" ||
    fail "the relative data.path was not made absolute: $(grep path "$work/rel/rel/deck.toml")"
  # Held-out validation: the metrics carry val_loss, the report its last value.
  sed -e 's/^synthetic_tokens = .*/&\nval_fraction = 0.1/' "${decks[0]}" >"$work/val.toml"
  printf '\n[eval]\ninterval = 2\nbatches = 1\n' >>"$work/val.toml"
  "$root/scripts/sweep" --steps 4 -o "$work/val" "$work/val.toml" >/dev/null || fail "the sweep with validation failed"
  [ "$(grep -c '"val_loss": [0-9.]*, "val_ms"' "$work/val/val/metrics.jsonl")" = 2 ] ||
    fail "not 2 validations in the metrics: $(grep -c val_loss "$work/val/val/metrics.jsonl")"
  "$root/scripts/report" "$work/val" -o "$work/val-report" >/dev/null || fail "scripts/report of a run with validation failed"
  grep -q "| final loss | final validation loss |" "$work/val-report/report.md" || fail "report.md has no validation column"
  val=$(tr -d '\r' <"$work/val-report/report.csv" |
        awk -F, 'NR == 1 {for (i = 1; i <= NF; i++) if ($i == "final_val_loss") c = i} NR == 2 {print $c}')
  [[ "$val" =~ ^[0-9]+\.[0-9]+$ ]] || fail "report.csv: final_val_loss is '$val'"
  "$root/scripts/report" "$work/runs" "$work/llmc" -o "$work/report" || fail "scripts/report failed"
  [ "$(grep -c '^| \(none\|1d\) |' "$work/report/report.md")" = 3 ] || fail "report.md has not 3 rows"
  [ "$(ls "$work/report"/*.png | wc -l)" = 10 ] || fail "not 10 plots (2 campaigns)"
  echo "scripts/sweep ran 3 runs here (one on an llm.c file), skipped the finished ones; scripts/report read them"
  ;;
errors)
  # A good run to damage: one rank, 3 steps.
  "$root/scripts/sweep" --steps 3 -o "$work/good" "$root/inputs/perf/tiny/suite/none-1.toml" >/dev/null ||
    fail "scripts/sweep failed"
  good=$work/good/none-1
  mk() { rm -rf "$work/$1" && cp -r "$good" "$work/$1" && echo "$work/$1"; }
  expect_error "--repeat 0: at least 1" "$root/scripts/sweep" --repeat 0 -o "$work/rep0" \
    "$root/inputs/perf/tiny/suite/none-1.toml"
  # No Python with numpy and matplotlib: the message names both Debian packages.
  out=$(CUBELM_PYTHON=/nonexistent/python3 "$root/scripts/report" "$good" -o "$work/nopy" 2>&1) &&
    fail "scripts/report ran without a Python"
  grep -q "the Debian packages python3-numpy python3-matplotlib" <<<"$out" ||
    fail "the missing-Python message does not name the Debian packages: $out"
  report() { "$root/scripts/report" "$@" -o "$work/out"; }
  mkdir -p "$work/empty"
  expect_error "empty: neither a run directory .* nor a campaign directory" report "$work/empty"
  expect_error "nowhere: no such directory" report "$work/nowhere"
  d=$(mk nometrics) && rm "$d/metrics.jsonl"
  expect_error "nometrics: not a run directory: metrics.jsonl is missing" report "$d"
  d=$(mk emptymetrics) && : >"$d/metrics.jsonl"
  expect_error "emptymetrics/metrics.jsonl: no steps" report "$d"
  d=$(mk badline) && echo '{"step": 3, "loss": ' >>"$d/metrics.jsonl"
  expect_error "badline/metrics.jsonl:4: not a JSON object" report "$d"
  d=$(mk nosplit) && sed -i '2s/"compute_ms"/"compute"/' "$d/metrics.jsonl"
  expect_error "nosplit/metrics.jsonl:2: 'compute_ms' is missing" report "$d"
  d=$(mk badval) && sed -i '2s/"loss": /"val_loss": "low", &/' "$d/metrics.jsonl"
  expect_error "badval/metrics.jsonl:2: 'val_loss' is not a number" report "$d"
  d=$(mk twice) && sed -n 2p "$d/metrics.jsonl" >>"$d/metrics.jsonl"
  expect_error "twice/metrics.jsonl:4: step 1 again \(first on line 2\)" report "$d"
  d=$(mk badmode) && sed -i 's/^tensor_mode = .*/tensor_mode = "4d"/' "$d/deck.toml"
  expect_error "badmode/deck.toml: parallel.tensor_mode = \"4d\": unknown mode" report "$d"
  d=$(mk badtoml) && echo "hidden = = 3" >>"$d/deck.toml"
  expect_error "badtoml/deck.toml: not a valid TOML deck" report "$d"
  d=$(mk othercheck) && sed -i 's/"world": 1/"world": 8/' "$d/check.json"
  expect_error "othercheck/check.json: world 8 but deck.toml's layout has 1 rank" report "$d"
  d=$(mk badcheck) && echo "{" >"$d/check.json"
  expect_error "badcheck/check.json: not valid JSON" report "$d"
  expect_error "none after the warm-up \(--warmup 5\)" report "$good" --warmup 5
  d=$(mk badshare) && sed -i '2s/"peak_share": [0-9.e+-]*/"peak_share": 1.5/' "$d/metrics.jsonl"
  expect_error "badshare/metrics.jsonl:2: 'peak_share' is 1.5, expected a number in \(0, 1\]" report "$d"
  expect_error "--machine $work/no-machine.toml: no such file" report "$good" --machine "$work/no-machine.toml"
  expect_error "--cubelm $work/empty: not an executable program" \
    report "$good" --machine "$root/inputs/machines/cpu-node.toml" --cubelm "$work/empty"
  # --skip-bad reports the rest and names what it left out.
  "$root/scripts/report" --skip-bad "$good" "$work/badline" "$work/badmode" -o "$work/out" >/dev/null ||
    fail "scripts/report --skip-bad failed"
  grep -q "^- .*badline/metrics.jsonl:4: not a JSON object" "$work/out/report.md" &&
    grep -q "^- .*badmode/deck.toml: .*unknown mode" "$work/out/report.md" ||
    fail "report.md does not name the run directories left out"
  echo "refused as expected: scripts/report --skip-bad left out 2 and reported 1"

  sweep() { "$root/scripts/sweep" "$@"; }
  expect_error "badmode/deck.toml: parallel.tensor_mode = \"4d\": unknown mode" sweep -o "$work/s1" "$work/badmode/deck.toml"
  expect_error "a run named 'deck' comes from .* already" sweep -o "$work/s2" "$good/deck.toml" "$work/twice/deck.toml"
  expect_error "--data $work/good/none-1/deck.toml: not an llm.c token file" \
    sweep --data "$good/deck.toml" -o "$work/s3" "$good/deck.toml"
  expect_error "--data $work/no.bin: no such file" sweep --data "$work/no.bin" -o "$work/s3" "$good/deck.toml"
  expect_error "--sbatch-arg, --launcher, --one-at-a-time and --no-wait go with --launch sbatch" \
    sweep --sbatch-arg=--time=1 -o "$work/s4" "$good/deck.toml"
  expect_error "--steps -1: the number of steps is at least 0" sweep --steps -1 -o "$work/s4" "$good/deck.toml"
  expect_error "no-deck.toml: no such deck file" sweep -o "$work/s4" "$work/no-deck.toml"
  expect_error "holds a run of another deck" sweep --steps 4 -o "$work/good" "$root/inputs/perf/tiny/suite/none-1.toml"
  expect_error "--cubelm $work/empty/x: not an executable program" sweep --cubelm "$work/empty/x" -o "$work/s5" "$good/deck.toml"
  ;;
*) fail "unknown case '$case' (decks, local, errors)" ;;
esac
echo "PASS: $case"
