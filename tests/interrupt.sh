#!/usr/bin/env bash
# Interrupts a 2-rank `cubelm train` the way batch jobs are interrupted, then checks
# what is left and that a resumed run ends bitwise where an uninterrupted one does.
#
#   interrupt.sh WORKDIR DECK CASE MPIEXEC [MPIEXEC ARGS...] -- CUBELM
#
# CASE:
#   signal-rank:SIG    SIG (TERM, USR1) to one rank after 20 steps: exit 75 with a checkpoint
#   signal-mpirun:SIG  SIG to the launcher, which forwards it to every rank (exit 75 for
#                      USR1; Open MPI's mpirun ends with 1 after forwarding TERM)
#   kill-before-rename SIGKILL of rank 0 while the step-1000 checkpoint is written but not
#                      yet renamed (CUBELM_TEST_PAUSE_BEFORE_RENAME): the step-500 one survives
#   signal-in-write:SIG  SIG to one rank while rank 0 holds the step-500 checkpoint before
#                      its rename for 3 s (CUBELM_TEST_PAUSE_BEFORE_RENAME=...:3000; with
#                      checkpoint.async the write is in the background): exit 75, the
#                      step-500 write committed first, then the stop's checkpoint
#   hang-in-checkpoint rank 0 stops for good before the step-1000 rename, with
#                      parallel.timeout_s = 3: the watchdog ends the job (exit 124) naming
#                      the checkpoint, and step 500 stays loadable
#   time-limit         train.time_limit_s = 2: the run stops in time with a checkpoint
#   end-time           CUBELM_END_TIME = now + 3 s: the same, from the environment
set -uo pipefail
work=$1 deck=$(realpath "$2") case=$3
shift 3
launcher=()
while [ "$1" != "--" ]; do launcher+=("$1"); shift; done
cubelm=$(realpath "$2")

fail() { echo "FAIL: $*"; for f in "$work"/*/run*.log; do echo "--- $f"; tail -n 30 "$f"; done; exit 1; }

# Runs `cubelm train` in directory $1 (background: sets $pid), output in $1/$2.
start() {
  (cd "$1" && exec timeout 120 "${launcher[@]}" "$cubelm" train deck.toml >"$2" 2>&1) &
  pid=$!
}
# Waits until file $1 has at least $2 lines (20 s at most).
wait_lines() {
  for _ in $(seq 400); do
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "$1 never reached $2 lines"
}
# Starts the run in $work/run (output run1.log, sets $pid) with rank 0 pausing before
# the rename of $1 (CUBELM_TEST_PAUSE_BEFORE_RENAME), and waits (30 s at most) until it has.
start_paused() {
  (cd "$work/run" && CUBELM_TEST_PAUSE_BEFORE_RENAME=$1 exec timeout 120 \
    "${launcher[@]}" "$cubelm" train deck.toml >run1.log 2>&1) &
  pid=$!
  for _ in $(seq 600); do
    grep -q "paused before renaming" "$work/run/run1.log" 2>/dev/null && break
    sleep 0.05
  done
}
# The MPI ranks: the processes running cubelm below $1 (the launcher and timeout are not).
ranks() { pgrep -f -- "$cubelm train deck.toml" | while read -r p; do
  [ "$(ps -o comm= -p "$p")" = "$(basename "$cubelm")" ] && echo "$p"; done; }

rm -rf "$work" && mkdir -p "$work/ref" "$work/run"
cp "$deck" "$work/ref/deck.toml" && cp "$deck" "$work/run/deck.toml"

rc=0
case $case in
signal-rank:* | signal-mpirun:*)
  sig=${case#*:}
  start "$work/run" run1.log
  wait_lines "$work/run/metrics.jsonl" 20
  if [ "${case%%:*}" = signal-rank ]; then
    target=$(ranks | tail -n 1)
  else
    target=$(pgrep -P "$pid" -f -- "$cubelm" | sed -n 1p) # the launcher below timeout
  fi
  [ -n "$target" ] || fail "no process to signal"
  kill -s "$sig" "$target"
  wait "$pid"; rc=$?
  if [ "$case" = signal-mpirun:TERM ]; then
    # Open MPI 4's mpirun forwards SIGTERM to the ranks, which stop as asked, but then
    # ends with its own status 1; Open MPI 5's ends the ranks without forwarding it
    # (docs/reliability.md). Either way the job ends non-zero and resuming still works.
    [ "$rc" != 0 ] || fail "exit status 0 after SIGTERM to the launcher"
    grep -q "stopped early after step [0-9]* of 1500 (SIGTERM on [12] rank" "$work/run/run1.log" ||
      echo "the launcher ended the ranks without forwarding SIGTERM (exit $rc)"
  else
    [ "$rc" = 75 ] || fail "exit status $rc after SIG$sig, expected 75"
    grep -q "stopped early after step [0-9]* of 1500 (SIG$sig on [12] rank" "$work/run/run1.log" ||
      fail "no stop message naming SIG$sig"
  fi
  ;;
signal-in-write:*)
  sig=${case#*:}
  start_paused step_00000500.h5:3000
  grep -q "paused before renaming" "$work/run/run1.log" || fail "the test hook never paused"
  target=$(ranks | tail -n 1)
  [ -n "$target" ] || fail "no process to signal"
  kill -s "$sig" "$target"
  wait "$pid"; rc=$?
  [ "$rc" = 75 ] || fail "exit status $rc after SIG$sig during the write, expected 75"
  grep -q "stopped early after step [0-9]* of 1500 (SIG$sig on 1 rank" "$work/run/run1.log" ||
    fail "no stop message naming SIG$sig"
  stop=$(sed -n 's/.*stopped early after step \([0-9]*\) of.*/\1/p' "$work/run/run1.log")
  # The write in flight was committed before the stop's checkpoint was taken.
  order=$(grep -o "^checkpoint ckpt/step_[0-9]*.h5" "$work/run/run1.log" | tr '\n' ' ')
  [ "$order" = "checkpoint ckpt/step_00000500.h5 $(printf 'checkpoint ckpt/step_%08d.h5' $((stop + 1))) " ] ||
    fail "checkpoints in the wrong order or missing: $order"
  "$cubelm" verify "$(printf "%s/run/ckpt/step_%08d.h5" "$work" $((stop + 1)))" >/dev/null ||
    fail "the stop's checkpoint does not verify"
  echo "SIG$sig during the step-500 write: stopped after step $stop, exit 75"
  ;;
kill-before-rename)
  start_paused step_00001000.h5
  paused=$(sed -n 's/.*rank 0 (pid \([0-9]*\)) paused before renaming.*/\1/p' "$work/run/run1.log")
  [ -n "$paused" ] || fail "the test hook never paused"
  [ -f "$work/run/ckpt/step_00001000.h5.partial" ] || fail "no step_00001000.h5.partial while paused"
  kill -KILL "$paused"
  wait "$pid"; rc=$?
  [ "$rc" != 0 ] || fail "the killed job exited 0"
  [ ! -e "$work/run/ckpt/step_00001000.h5" ] || fail "step_00001000.h5 became visible"
  [ -f "$work/run/ckpt/step_00000500.h5" ] || fail "the previous checkpoint step_00000500.h5 is gone"
  "$cubelm" verify "$work/run/ckpt/step_00000500.h5" >/dev/null || fail "step_00000500.h5 does not verify"
  ;;
hang-in-checkpoint)
  sed -i 's/^\[parallel\]$/[parallel]\ntimeout_s = 3/' "$work/run/deck.toml"
  begin=$(date +%s)
  (cd "$work/run" && CUBELM_TEST_PAUSE_BEFORE_RENAME=step_00001000.h5 exec timeout 120 \
    "${launcher[@]}" "$cubelm" train deck.toml >run1.log 2>&1) &
  pid=$!
  wait "$pid"; rc=$?
  took=$(($(date +%s) - begin))
  [ "$rc" = 124 ] || fail "exit status $rc, expected the watchdog's 124"
  grep -q "no progress for [0-9.]* s in [a-z_]* on group 'checkpoint'" "$work/run/run1.log" ||
    fail "the watchdog did not name the checkpoint"
  [ ! -e "$work/run/ckpt/step_00001000.h5" ] || fail "step_00001000.h5 became visible"
  "$cubelm" verify "$work/run/ckpt/step_00000500.h5" >/dev/null || fail "step_00000500.h5 does not verify"
  echo "ended by the watchdog after ${took} s: $(grep -o "no progress[^;]*" "$work/run/run1.log" | sed -n 1p)"
  echo "PASS: $case"
  exit 0
  ;;
time-limit | end-time)
  if [ "$case" = time-limit ]; then
    sed -i 's/^\[train\]$/[train]\ntime_limit_s = 2/' "$work/run/deck.toml"
    expect="train.time_limit_s = 2"
  else
    export CUBELM_END_TIME=$(($(date +%s) + 3))
    expect="the job's end time (CUBELM_END_TIME)"
  fi
  sed -i 's/^steps = .*/steps = 1000000/' "$work/run/deck.toml"
  begin=$(date +%s.%N)
  start "$work/run" run1.log
  wait "$pid"; rc=$?
  unset CUBELM_END_TIME
  took=$(echo "$(date +%s.%N) - $begin" | bc)
  [ "$rc" = 75 ] || fail "exit status $rc at the time limit, expected 75"
  grep -qF "time limit: $expect" "$work/run/run1.log" || fail "the limit is not announced: $expect"
  grep -q "stopped early after step [0-9]* of 1000000 (too little time left before the deadline" \
    "$work/run/run1.log" || fail "no stop message naming the deadline"
  step=$(sed -n 's/.*stopped early after step \([0-9]*\) of.*/\1/p' "$work/run/run1.log")
  ckpt=$(printf "%s/run/ckpt/step_%08d.h5" "$work" $((step + 1)))
  "$cubelm" verify "$ckpt" >/dev/null || fail "the checkpoint $ckpt does not verify"
  echo "stopped after step $step in $took s (limit 2-3 s from start-up)"
  echo "PASS: $case"
  exit 0
  ;;
*) fail "unknown case $case" ;;
esac

# Continue to the end; the result must equal the uninterrupted run bitwise (run after
# the interruption, for the cases that compare: the others end above).
had=$(ls "$work/run/ckpt" 2>/dev/null || true)
start "$work/run" run2.log
wait "$pid" || fail "the resumed run failed"
start "$work/ref" run.log
wait "$pid" || fail "the uninterrupted run failed"
final=$(ls "$work/ref/ckpt" | tail -n 1)
if [ -n "$had" ] || [ "$case" != signal-mpirun:TERM ]; then
  grep -q "resumed from ckpt/step_" "$work/run/run2.log" || fail "the second run did not resume"
fi
h5diff "$work/ref/ckpt/$final" "$work/run/ckpt/$final" >"$work/h5diff.txt" 2>&1 ||
  fail "$final differs from the uninterrupted run's: $(head -n 5 "$work/h5diff.txt")"
cmp <(cut -d, -f1-3 "$work/ref/metrics.jsonl") <(cut -d, -f1-3 "$work/run/metrics.jsonl") ||
  fail "step, loss and gradient norm differ from the uninterrupted run's"
echo "$(grep -o 'resumed from [^ ]* after step [0-9]*' "$work/run/run2.log"); $final equal bitwise"
echo "PASS: $case"
