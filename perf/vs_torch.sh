#!/usr/bin/env bash
# cubelm's training step against PyTorch's on this CPU, side by side in one run
# (docs/kernels.md#against-pytorch): perf/bench_train and perf/torch_gpt2.py take
# turns, round after round, at each thread count, with the same BLAS kernels for
# both (the OPENBLAS_CORETYPE cubelm runs: its own choice, or the machine's).
#
#   perf/vs_torch.sh [--model small|gpt2-124m] [--threads "1 2"] [--rounds N]
#                    [--steps S] [--batch B] [--build DIR]
#
# small: L 4 H 256 a 8 T 256 V 8192, B 8, with the sgemm 1024^3 rate measured between
# its steps (bench_train's sgemm_GFLOP/s); gpt2-124m: L 12 H 768 a 12 T 1024 V 50257,
# B 4 (--batch). Prints one line per program, round and thread count, then per thread
# count the best and the median tokens/s of each, their ratio, cubelm's model FLOP rate
# over its sgemm rate (small: lowest, highest and median over the rounds), the 2-thread
# speed-up, and each program's peak resident memory (max over rounds, /usr/bin/time).
# Needs a Python that imports torch (CUBELM_PYTHON, python3, /usr/bin/python3).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$CUBELM_ROOT"

model=small threads="1 2" rounds=3 steps="" batch="" build=build/cpu
while [ $# -gt 0 ]; do
  case $1 in
  --model) model=$2; shift 2 ;;
  --threads) threads=$2; shift 2 ;;
  --rounds) rounds=$2; shift 2 ;;
  --steps) steps=$2; shift 2 ;;
  --batch) batch=$2; shift 2 ;;
  --build) build=$2; shift 2 ;;
  -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "perf/vs_torch.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
case $model in
small) steps=${steps:-4} batch=${batch:-8} ;;
gpt2-124m) steps=${steps:-2} batch=${batch:-4} ;;
*) echo "perf/vs_torch.sh: --model is small or gpt2-124m, not '$model'" >&2; exit 2 ;;
esac
bench=$build/perf/bench_train cubelm=$build/src/cubelm
[ -x "$bench" ] && [ -x "$cubelm" ] || { echo "perf/vs_torch.sh: build $bench and $cubelm first (scripts/test or cmake --build --preset cpu)" >&2; exit 1; }
py=$(cubelm_python torch) || { echo "perf/vs_torch.sh: no Python that imports torch (apt-get install python3-torch, or set CUBELM_PYTHON)" >&2; exit 1; }

# The kernel set cubelm runs, given to PyTorch's OpenBLAS too.
version=$("$cubelm" --version)
coretype=${OPENBLAS_CORETYPE:-$(sed -n 's/.*OPENBLAS_CORETYPE=\([A-Za-z0-9_]*\) set by cubelm.*/\1/p' <<<"$version")}
echo "$version" | grep -E "^  (BLAS|CPU)"
echo "PyTorch: $("$py" -c 'import torch; print(torch.__version__)') ($py), OPENBLAS_CORETYPE=${coretype:-unset}"

# A counter of a benchmark row of bench_train's output: counter ROW NAME ("2.4k/s" -> 2400).
counter() {
  awk -v row="$1" -v key="$2=" 'index($1, row) == 1 {
    for (i = 2; i <= NF; ++i) if (index($i, key) == 1) {
      v = substr($i, length(key) + 1); sub("/s$", "", v); if (v ~ /k$/) { sub("k$", "", v); v *= 1000 }; print v } }' "$out/c"
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  for t in $threads; do
    export OMP_NUM_THREADS=$t OMP_PROC_BIND=spread OMP_PLACES=threads
    if [ "$model" = small ]; then
      row=BM_TrainStepSmall
      /usr/bin/time -f "%M" -o "$out/rss" "$bench" --benchmark_filter='BM_TrainStepSmall' >"$out/c" 2>&1
      sg=$(counter "$row" sgemm_GFLOP/s)
    else
      row=BM_TrainStepGPT2
      CUBELM_BENCH_GPT2=1 /usr/bin/time -f "%M" -o "$out/rss" "$bench" --benchmark_filter='GPT2/fp32' \
        --gpt2-batch="$batch" --gpt2-steps="$steps" >"$out/c" 2>&1
      sg=""
    fi
    tok=$(counter "$row" tok/s)
    gf=$(counter "$row" GFLOP/s)
    [ -n "$tok" ] || { cat "$out/c" >&2; echo "perf/vs_torch.sh: bench_train printed no step" >&2; exit 1; }
    echo "round $r threads $t cubelm tok/s $tok GFLOP/s $gf sgemm ${sg:-n/a} rss_kib $(cat "$out/rss")" | tee -a "$out/rows"
    env ${coretype:+OPENBLAS_CORETYPE=$coretype} /usr/bin/time -f "%M" -o "$out/rss" \
      "$py" perf/torch_gpt2.py --model "$model" --precision fp32 --device cpu --threads "$t" \
      --steps "$steps" --warmup 1 --batch "$batch" >"$out/p" 2>&1 || { cat "$out/p" >&2; exit 1; }
    tok=$(grep -o 'tok/s=[0-9.]*' "$out/p" | tail -n 1 | cut -d= -f2)
    echo "round $r threads $t torch tok/s $tok rss_kib $(cat "$out/rss")" | tee -a "$out/rows"
  done
done

echo "summary ($model, $rounds rounds; best / median tokens/s):"
awk -v threads="$threads" '
  { t = $4; p = $5; n[t, p]++; tok[t, p, n[t, p]] = $7; if ($NF > rss[t, p]) rss[t, p] = $NF
    if (p == "cubelm" && $11 != "n/a") { ratio[t, n[t, p]] = $9 / $11; if ($11 > sg[t]) sg[t] = $11 } }
  function best(t, p,   i, b) { b = 0; for (i = 1; i <= n[t, p]; ++i) if (tok[t, p, i] > b) b = tok[t, p, i]; return b }
  function median(t, p,   i, j, k, a, m) { m = n[t, p]; for (i = 1; i <= m; ++i) a[i] = tok[t, p, i]
    for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (a[j] < a[i]) { k = a[i]; a[i] = a[j]; a[j] = k }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  END {
    split(threads, ts, " ")
    for (k = 1; k in ts; ++k) {
      t = ts[k]; c = best(t, "cubelm"); p = best(t, "torch")
      line = sprintf("  %s thread%s: cubelm %.0f / %.0f, PyTorch %.0f / %.0f: %.2fx / %.2fx", t, t == 1 ? "" : "s",
                     c, median(t, "cubelm"), p, median(t, "torch"), c / p, median(t, "cubelm") / median(t, "torch"))
      if ((t, 1) in ratio) {
        delete r; m = 0; for (i = 1; (t, i) in ratio; ++i) r[++m] = ratio[t, i]
        for (i = 1; i <= m; ++i) for (j = i + 1; j <= m; ++j) if (r[j] < r[i]) { x = r[i]; r[i] = r[j]; r[j] = x }
        line = line sprintf("; step/sgemm %.0f-%.0f%% (median %.0f%%)", 100 * r[1], 100 * r[m],
                            100 * (m % 2 ? r[(m + 1) / 2] : (r[m / 2] + r[m / 2 + 1]) / 2))
      }
      line = line sprintf("; peak RSS cubelm %.0f MiB, PyTorch %.0f MiB", rss[t, "cubelm"] / 1024, rss[t, "torch"] / 1024)
      print line
      if (k > 1) printf("  %s threads over 1: cubelm %.2fx, PyTorch %.2fx%s\n", t,
                        best(t, "cubelm") / best(ts[1], "cubelm"), best(t, "torch") / best(ts[1], "torch"),
                        (t in sg) && (ts[1] in sg) ? sprintf(", sgemm %.2fx (best over best, between the steps)", sg[t] / sg[ts[1]]) : "")
    }
  }' "$out/rows"
