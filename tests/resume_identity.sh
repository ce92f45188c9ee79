#!/usr/bin/env bash
# Whose checkpoint (docs/reliability.md#whose-checkpoint), as a user meets it with
# `cubelm train`: a run resumes only its own checkpoints, never writes beside or over
# another run's, and checkpoint.allow_other_run is the way to do it on purpose.
#
#   resume_identity.sh WORKDIR CUBELM MPIEXEC [MPIEXEC ARGS...] --
#
# Cases, in order (each names itself on failure):
#   other-seed        seed 99 against a seed-1 run's checkpoints: refused by resume = "auto"
#                     and by a file name, naming train.seed; the files are unchanged
#   other-data        another synthetic corpus: refused, naming data.synthetic_branching
#   continue          more steps, another learning rate and 2 ranks of 1d tensor
#                     parallelism: resumed
#   allow-other-run   seed 99 with checkpoint.allow_other_run = true: resumed, with a note
#   none-other-run    resume = "none" into the seed-1 run's directory with seed 99:
#                     refused, nothing written
#   none-same-run     the seed-1 deck again with resume = "none": runs, says it replaces
set -uo pipefail
work=$1 cubelm=$2
shift 2
launcher=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
rm -rf "$work" && mkdir -p "$work" && cd "$work" || { echo "FAIL: no work directory $work"; exit 1; }

case_name=setup
fail() { echo "FAIL: $case_name: $*"; exit 1; }

# deck NAME SEED BRANCHING STEPS RESUME [EXTRA TOML LINES...]: writes NAME.toml.
deck() {
  local name=$1 seed=$2 branching=$3 steps=$4 resume=$5
  shift 5
  cat >"$name.toml" <<DECK
[model]
vocab_size = 64
seq_len = 16
hidden = 32
heads = 2
layers = 1
[parallel]
[train]
steps = $steps
global_batch = 4
seed = $seed
[optimizer]
lr = 1e-3
[data]
synthetic_tokens = 4000
synthetic_branching = $branching
[checkpoint]
dir = "ckpt"
interval = 2
resume = "$resume"
allow_other_run = ${ALLOW:-false}
[log]
peak_gflops = 1.0
DECK
  local line
  for line in "$@"; do
    # "[section] key = value" lines go into their section.
    local section=${line%%]*}] kv=${line#*] }
    sed -i "/^\\${section%]}\\]$/a $kv" "$name.toml"
  done
}
# train NAME [LAUNCHER...]: runs cubelm train NAME.toml on one process (or the launcher);
# output in NAME.out, exit status in $rc.
train() {
  local name=$1
  shift
  OMP_NUM_THREADS=1 OMP_PROC_BIND=false "$@" "$cubelm" train "$name.toml" >"$name.out" 2>&1
  rc=$?
}
sums() { md5sum ckpt/* | sort; }

deck first 1 4 4 none
train first
[ $rc -eq 0 ] || fail "the first run failed: $(tail -5 first.out)"
[ -f ckpt/step_00000002.h5 ] && [ -f ckpt/step_00000004.h5 ] || fail "no checkpoints: $(ls ckpt)"
before=$(sums)

case_name=other-seed
deck seed 99 4 6 auto
train seed
[ $rc -ne 0 ] || fail "resume = \"auto\" took a seed-1 checkpoint for seed 99: $(tail -5 seed.out)"
grep -q "checkpoint ckpt/step_00000004.h5 is another run's: train.seed = 1 there, 99 in the deck\." seed.out ||
  fail "the refusal does not name the file and train.seed: $(cat seed.out)"
grep -q "skipped" seed.out && fail "resume = \"auto\" stepped over another run's file: $(cat seed.out)"
sed -i 's|^resume = .*|resume = "ckpt/step_00000002.h5"|' seed.toml
train seed
[ $rc -ne 0 ] || fail "an explicit file of seed 1 was resumed with seed 99"
grep -q "checkpoint ckpt/step_00000002.h5 is another run's: train.seed = 1 there, 99 in the deck\." seed.out ||
  fail "the refusal of the named file does not say why: $(cat seed.out)"
[ "$(sums)" = "$before" ] || fail "the checkpoints changed"
# cubelm check says the same before any job starts, with exit status 1.
sed -i 's|^resume = .*|resume = "auto"|' seed.toml
OMP_NUM_THREADS=1 "$cubelm" check seed.toml >check_seed.out 2>&1
[ $? -eq 1 ] || fail "cubelm check passed a deck that would resume another run's checkpoint"
grep -q "problem    checkpoint.resume: ckpt/step_00000004.h5 is another run's: train.seed = 1 there, 99 in the deck" check_seed.out ||
  fail "cubelm check does not name the other run's checkpoint: $(cat check_seed.out)"

case_name=other-data
deck data 1 2 6 auto
train data
[ $rc -ne 0 ] || fail "a run on another corpus resumed"
grep -q "data.synthetic_branching = 4 there, 2 in the deck" data.out || fail "$(cat data.out)"
[ "$(sums)" = "$before" ] || fail "the checkpoints changed"

case_name=none-other-run
deck fresh 99 4 4 none
train fresh
[ $rc -ne 0 ] || fail "a seed-99 run from step 0 wrote into the seed-1 run's directory"
grep -q "checkpoint.dir = \"ckpt\" holds ckpt/step_00000004.h5: it is another run's (train.seed = 1 there, 99 in the deck)" fresh.out ||
  fail "the refusal does not name the directory, the file and the key: $(cat fresh.out)"
[ "$(sums)" = "$before" ] || fail "the checkpoints changed"
[ "$(ls ckpt | wc -l)" -eq 2 ] || fail "files were added: $(ls ckpt)"
OMP_NUM_THREADS=1 "$cubelm" check fresh.toml >check_fresh.out 2>&1
[ $? -eq 1 ] || fail "cubelm check passed a run from step 0 into another run's directory"
grep -q "problem    checkpoint: checkpoint.dir = \"ckpt\" holds ckpt/step_00000004.h5: it is another run's" check_fresh.out ||
  fail "cubelm check does not say whose the directory is: $(cat check_fresh.out)"
OMP_NUM_THREADS=1 "$cubelm" check first.toml >check_first.out 2>&1
[ $? -eq 0 ] || fail "cubelm check refused the deck that wrote the directory: $(cat check_first.out)"
grep -q "checkpoint from step 0 into ckpt (replacing 2 checkpoint(s) of an earlier run of this deck)" check_first.out ||
  fail "cubelm check does not say it replaces: $(cat check_first.out)"

case_name=allow-other-run
ALLOW=true deck allowed 99 4 6 auto
train allowed
[ $rc -eq 0 ] || fail "allow_other_run = true did not resume: $(tail -5 allowed.out)"
grep -q "note: checkpoint ckpt/step_00000004.h5 is another run's (train.seed = 1 there, 99 in the deck): resumed from it anyway" allowed.out ||
  fail "no note of the differences: $(cat allowed.out)"
grep -q "resumed from ckpt/step_00000004.h5 after step 4" allowed.out || fail "$(cat allowed.out)"
rm -f ckpt/step_00000006.h5

case_name=continue
deck more 1 4 6 auto "[optimizer] min_lr = 1e-5" "[parallel] tensor_mode = \"1d\"" "[parallel] tensor_size = 2"
sed -i 's/^lr = .*/lr = 5e-4/' more.toml
train more "${launcher[@]}"
[ $rc -eq 0 ] || fail "6 steps, lr 5e-4, 2 tensor ranks did not continue the run: $(tail -5 more.out)"
grep -q "resumed from ckpt/step_00000004.h5 after step 4" more.out || fail "$(cat more.out)"
grep -q "another run" more.out && fail "a continuation was taken for another run: $(cat more.out)"
[ -f ckpt/step_00000006.h5 ] || fail "no step-6 checkpoint"

case_name=none-same-run
train first
[ $rc -eq 0 ] || fail "the same deck again from step 0 failed: $(tail -5 first.out)"
grep -q "checkpoint.dir = ckpt holds 3 checkpoint(s) of an earlier run of this deck" first.out ||
  fail "it does not say it replaces the earlier run's checkpoints: $(cat first.out)"
echo "PASS: resume identity"
