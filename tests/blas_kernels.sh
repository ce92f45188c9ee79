#!/usr/bin/env bash
# The BLAS kernels cubelm runs, as a user meets them (docs/launching.md#blas-kernels):
#   - `cubelm --version` and the start line of a 2-rank `mpiexec ... cubelm train` name
#     the kernel set, and it is not below the processor (unless this machine's own
#     environment sets OPENBLAS_CORETYPE, which is kept);
#   - where the BLAS alone chose kernels below the processor, cubelm says it set
#     OPENBLAS_CORETYPE, and OpenBLAS' own report (OPENBLAS_VERBOSE=2) agrees;
#   - a user's OPENBLAS_CORETYPE below the processor (Prescott, the oldest x86-64
#     kernels) is kept, with a warning that names the value that fits. Only where this
#     machine sets no OPENBLAS_CORETYPE of its own;
#   - 2 threads bound by OpenMP (OMP_PROC_BIND) still have a CPU each after the restart.
#   tests/blas_kernels.sh WORKDIR CUBELM MPIEXEC [MPIEXEC ARGS...] --
set -uo pipefail
work=$1 cubelm=$2
shift 2
launcher=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || fail "no work directory $work"

version=$("$cubelm" --version 2>"$work/version.err") || fail "cubelm --version failed: $(cat "$work/version.err")"
kernels=$(grep "^  BLAS kernels " <<<"$version" | sed 's/^  BLAS kernels *//')
cpu=$(grep "^  CPU " <<<"$version" | sed 's/^  CPU *//')
echo "kernels: $kernels"
echo "cpu:     $cpu"
[ -n "$kernels" ] || fail "cubelm --version names no BLAS kernels: $version"
case "$kernels" in
  "not OpenBLAS"*) echo "SKIP: the BLAS is not OpenBLAS"; exit 77 ;;
esac
case "$cpu" in
  "not x86-64"*) echo "SKIP: not an x86-64 processor"; exit 77 ;;
esac

machine_sets=${OPENBLAS_CORETYPE+yes}
if [ -n "$machine_sets" ]; then
  grep -q "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE from the environment" <<<"$kernels" ||
    fail "this machine sets OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, and cubelm does not say it kept it: $kernels"
else
  grep -q "BELOW" <<<"$kernels" && fail "cubelm runs kernels below the processor: $kernels"
  # What OpenBLAS chose when it loaded, each time: the first load is the BLAS alone.
  cores=$(OPENBLAS_VERBOSE=2 "$cubelm" --version 2>&1 | sed -n 's/^Core: //p' | tr '\n' ' ')
  echo "OpenBLAS' own report over the loads: $cores"
  first=$(awk '{print $1}' <<<"$cores")
  last=$(awk '{print $NF}' <<<"$cores")
  if grep -q "set by cubelm" <<<"$kernels"; then
    grep -q "alone chose $first" <<<"$kernels" || fail "cubelm says '$kernels', OpenBLAS first chose $first"
    [ "$(wc -w <<<"$cores")" -eq 2 ] || fail "OpenBLAS loaded $(wc -w <<<"$cores") times, expected 2 (one restart): $cores"
    grep -q "^$last kernels" <<<"$kernels" || fail "after the restart OpenBLAS runs $last, cubelm says '$kernels'"
  else
    [ "$(wc -w <<<"$cores")" -eq 1 ] || fail "no restart announced, but OpenBLAS loaded $(wc -w <<<"$cores") times: $cores"
  fi

  # A user's setting below the processor: kept, with a warning that names what fits.
  case "$cpu" in
    *AVX*)
      out=$(OPENBLAS_CORETYPE=Prescott "$cubelm" --version 2>&1)
      grep -q "BLAS kernels Prescott kernels (SSE, BELOW this AVX.* processor; OPENBLAS_CORETYPE=Prescott from the environment, kept)" <<<"$out" ||
        fail "OPENBLAS_CORETYPE=Prescott: --version does not say it kept it: $out"
      grep -q "cubelm: warning: OpenBLAS .* runs Prescott (SSE kernels) on this AVX.* processor because the environment sets OPENBLAS_CORETYPE=Prescott: .* set OPENBLAS_CORETYPE=[A-Za-z]*, unless this machine needs it" <<<"$out" ||
        fail "OPENBLAS_CORETYPE=Prescott: no warning naming the kernels that fit: $out"
      ;;
  esac
fi

# A direct mpiexec, 2 ranks of data parallelism, the peak measured: the start line
# names the kernels and the peak, and no step's MFU is above 100%.
deck=$work/tiny.toml
cat >"$deck" <<'DECK'
[model]
vocab_size = 64
seq_len = 16
hidden = 32
heads = 2
layers = 1
[parallel]
data_size = 2
[train]
steps = 4
global_batch = 4
[data]
synthetic_tokens = 4000
[checkpoint]
dir = "checkpoints"
DECK
OMP_NUM_THREADS=1 OMP_PROC_BIND=false "${launcher[@]}" "$cubelm" train "$deck" >"$work/train.out" 2>&1 ||
  fail "mpiexec ... cubelm train failed: $(tail -20 "$work/train.out")"
start=$(grep "^cubelm train: " "$work/train.out")
echo "$start"
grep -q "peak [0-9.]* GFLOP/s/rank (sgemm [0-9.]* GFLOP/s alone on the node, 1 thread.*kernels (" <<<"$start" ||
  fail "the start line names no peak or kernels: $start"
[ -n "$machine_sets" ] || ! grep -q BELOW <<<"$start" || fail "the ranks run kernels below the processor: $start"
grep -q "MFU [0-9]*%" "$work/train.out" || fail "no MFU in the step lines"
awk '/MFU/ { for (i = 1; i < NF; ++i) if ($i == "MFU") { v = $(i + 1); sub("%", "", v); if (v + 0 > 100) bad = 1 } }
     END { exit bad }' "$work/train.out" || fail "an MFU above 100%: $(grep MFU "$work/train.out")"
# The restart keeps the CPUs the process was given: with OMP_PROC_BIND the OpenMP runtime
# pins the first thread to its first place as the program loads, and a restart that kept
# that mask would run every thread on one CPU (cubelm then warns that threads share it,
# and the peak is a share of one CPU).
if [ "$(nproc)" -ge 2 ]; then
  sed 's/^data_size = 2/data_size = 1/' "$deck" >"$work/one.toml"
  OMP_NUM_THREADS=2 OMP_PROC_BIND=spread OMP_PLACES=threads "$cubelm" train "$work/one.toml" \
    >"$work/threads.out" 2>&1 || fail "cubelm train on 2 threads failed: $(tail -20 "$work/threads.out")"
  start=$(grep "^cubelm train: " "$work/threads.out")
  echo "$start"
  grep -q "alone on the node, 2 threads;" <<<"$start" ||
    fail "2 bound threads do not have a CPU each after the start: $start"
  grep -q "threads share cores" "$work/threads.out" &&
    fail "2 bound threads share a CPU after the start: $(grep warning "$work/threads.out")"
fi
echo "PASS: blas kernels"
