# Runs the deck of one run directory (docs/perf-runs.md): `cubelm check --json`
# into check.json, then `cubelm train deck.toml`, its output appended to
# train.log. Sourced by the batch scripts inputs/perf/cpu.sbatch and gpu.sbatch
# inside a Slurm job (the job's directory is the run directory), and run by
# `scripts/sweep --launch local` on this machine:
#
#   cd RUN_DIR && bash CUBELM_ROOT/scripts/perf/job.sh
#
# In a Slurm job each of the job's tasks is one rank with --cpus-per-task
# OpenMP threads bound to cores of its own; when the tasks of a node ask for
# more CPUs than it has (small test machines), one thread each, unbound, and
# Open MPI yields while it waits. Outside Slurm the placement is
# scripts/lib.sh's (docs/launching.md).
#
# SIGUSR1 to this shell (sbatch --signal=B:USR1@SECONDS) is passed on to the
# launcher, which passes it to every rank: cubelm checkpoints and exits with
# status 75 (docs/reliability.md). Only USR1 is trapped: bash can lose one of
# two trapped signals that arrive back to back (Slurm sends SIGCONT first).
#
# Environment:
#   CUBELM              the cubelm program (default: the checkout's build/cpu/src/cubelm)
#   CUBELM_ROOT         the checkout (default: set by the caller)
#   CUBELM_LAUNCHER     in a Slurm job: srun (default) or mpiexec
#   CUBELM_SRUN_ARGS    more srun arguments, e.g. "--mpi=pmix"
#   CUBELM_MPIEXEC_ARGS more mpiexec arguments
#   CUBELM_THREADS      OpenMP threads per rank instead of --cpus-per-task
#   CUBELM_RESUBMIT     after a stop before the time limit (status 75), run the run
#                       directory's submit.sh again, at most this many times (default 0)
#   CUBELM_RANKS        outside Slurm: ranks to start (default: the deck's layout)
#
# jobs.txt of the run directory gets one line per event: "JOB started TIME HOST",
# "JOB exit STATUS TIME", "JOB resubmitted NEWJOB TIME". The exit status is
# cubelm train's.
# shellcheck shell=bash

set -uo pipefail
cubelm_job_say() { echo "[$(date +%H:%M:%S)] job.sh: $*"; }
# this job's part of train.log: from its last header on
cubelm_job_log() {
  awk -v h="=== job $job_id on " 'index($0, h) == 1 { text = "" } { text = text $0 "\n" } END { printf "%s", text }' train.log
}
cubelm_job_fail() { cubelm_job_say "error: $*"; echo "${job_id:-local} exit 2 $(date +%s)" >>jobs.txt; exit 2; }

CUBELM_ROOT=${CUBELM_ROOT:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}}
# shellcheck source=../lib.sh
source "$CUBELM_ROOT/scripts/lib.sh" || { echo "job.sh: no scripts/lib.sh in CUBELM_ROOT=$CUBELM_ROOT"; exit 2; }
cubelm=${CUBELM:-$CUBELM_ROOT/build/cpu/src/cubelm}
job_id=${SLURM_JOB_ID:-local}

[ -f deck.toml ] || cubelm_job_fail "no deck.toml in $(pwd): run this in a run directory (scripts/sweep makes them)"
[ -x "$cubelm" ] || cubelm_job_fail "CUBELM=$cubelm is not an executable cubelm program"
echo "$job_id started $(date +%s) $(hostname -s)" >>jobs.txt
cubelm_mpi_env

# --------------------------------------------------------------- placement --
launch=()
if [ -n "${SLURM_JOB_ID:-}" ]; then
  ranks=${SLURM_NTASKS:?SLURM_NTASKS is not set: submit with --ntasks}
  cpt=${SLURM_CPUS_PER_TASK:-1}
  # tasks on the first node, as Slurm placed them: SLURM_TASKS_PER_NODE reads like "4(x2),3"
  node_tasks=$(echo "${SLURM_TASKS_PER_NODE:-$ranks}" | sed 's/[(,].*//')
  [ "$node_tasks" -le "$ranks" ] || node_tasks=$ranks
  cpus=$(cubelm_cpus)
  if [ $((node_tasks * cpt)) -gt "$cpus" ]; then
    export OMP_NUM_THREADS=${CUBELM_THREADS:-1} OMP_PROC_BIND=false OMPI_MCA_mpi_yield_when_idle=1
    unset OMP_PLACES
    bind=none
    placement="$node_tasks tasks x $cpt CPUs on $cpus CPUs (oversubscribed): 1 thread each, unbound, yielding when idle"
  else
    export OMP_NUM_THREADS=${CUBELM_THREADS:-$cpt} OMP_PROC_BIND=close OMP_PLACES=cores
    bind=cores
    placement="$node_tasks tasks per node x $OMP_NUM_THREADS threads, each bound to $cpt CPUs of its own"
  fi
  case ${CUBELM_LAUNCHER:-srun} in
  srun)
    # srun does not take --cpus-per-task from the job in every Slurm version (22.05 does not).
    # shellcheck disable=SC2206
    launch=(srun --ntasks="$ranks" --cpus-per-task="$cpt" --cpu-bind="$bind" ${CUBELM_SRUN_ARGS:-})
    ;;
  mpiexec)
    launch=(mpiexec -n "$ranks")
    if mpiexec --version 2>/dev/null | grep -E 'Open MPI|OpenRTE' >/dev/null; then
      if [ "$bind" = cores ]; then launch+=(--map-by "slot:PE=$cpt" --bind-to core); else launch+=(--bind-to none); fi
    fi
    # shellcheck disable=SC2206
    launch+=(${CUBELM_MPIEXEC_ARGS:-})
    ;;
  *) cubelm_job_fail "CUBELM_LAUNCHER=${CUBELM_LAUNCHER}: use srun or mpiexec" ;;
  esac
  # The job's end time, for cubelm's own stop before the deadline: Slurm 23.02 and later
  # export SLURM_JOB_END_TIME; for older ones it is read from squeue.
  unset CUBELM_END_TIME
  if [ -z "${SLURM_JOB_END_TIME:-}" ]; then
    end=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null) &&
      end=$(date -d "$end" +%s 2>/dev/null) && export CUBELM_END_TIME=$end
  fi
fi

# ------------------------------------------------------- closed forms, once --
# One process: the deck's layout, sizes, memory estimate and traffic per step.
if ! OMP_NUM_THREADS=1 "$cubelm" check deck.toml --json >check.json.tmp 2>check.log; then
  cat check.log
  # Its verdict: the target, whether the deck fits, and the inputs' problems.
  sed -n 's/.*\("target": .*\)}$/\1/p' check.json.tmp
  cubelm_job_fail "cubelm check deck.toml failed (check.log; the verdict above)"
fi
mv check.json.tmp check.json
if [ -z "${SLURM_JOB_ID:-}" ]; then
  ranks=${CUBELM_RANKS:-$(sed -n 's/.*"world": \([0-9]*\).*/\1/p' check.json)}
  cubelm_place "${ranks:-1}"
  launch=("${CUBELM_LAUNCH[@]}")
  placement=$CUBELM_PLACEMENT
fi

# ------------------------------------------------------------------- train --
if [ -n "${SLURM_JOB_ID:-}" ]; then
  # Each task checks that the launcher bound it before OpenMP pins its threads.
  export CUBELM_TASK_CPUS=$cpt
  launch+=(bash "$CUBELM_ROOT/scripts/perf/rank.sh")
fi
# The node, for the report's titles: its processor, its CPUs, its GPUs.
node=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
[ -n "$node" ] || node=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
node="${node:-unknown processor}, $(nproc --all) CPUs"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
    awk '{ n = $1; $1 = ""; printf "%s%d x%s", (NR > 1 ? ", " : ""), n, $0 }')
  [ -z "$gpus" ] || node="$node, $gpus"
fi
{
  echo "=== job $job_id on $(hostname -s), $(date "+%Y-%m-%d %H:%M:%S"): $ranks rank(s)"
  echo "=== node: $node"
  echo "=== launch: ${launch[*]:-(one process)} $cubelm train deck.toml"
  echo "=== placement: $placement; OMP_NUM_THREADS=$OMP_NUM_THREADS${CUBELM_END_TIME:+; CUBELM_END_TIME=$CUBELM_END_TIME}"
} >>train.log
cubelm_job_say "job $job_id: $ranks ranks, ${launch[0]:-one process}; $placement"
"${launch[@]}" "$cubelm" train deck.toml >>train.log 2>&1 &
child=$!
trap 'cubelm_job_say "SIGUSR1: passed on to the ranks"; kill -USR1 "$child" 2>/dev/null' USR1
# bash runs a trap only between commands: wait until the launcher has really ended.
while :; do
  wait "$child"
  rc=$?
  if [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null; then continue; fi
  if [ "$rc" -gt 128 ]; then
    wait "$child" 2>/dev/null
    r=$?
    [ "$r" -ne 127 ] && rc=$r
  fi
  break
done
# A SIGUSR1 that comes now, the launcher ended (a run that finished just as the time
# limit neared), is ignored: this shell must still record the run's status and resubmit.
# With the default action it ended here, and Slurm marked the job FAILED on signal 10.
trap '' USR1
# cubelm restores the default action of SIGUSR1 once its steps are done: a signal that
# comes after them ends a complete run (its checkpoint written, "done:" printed).
if [ "$rc" = $((128 + 10)) ] && cubelm_job_log | grep '^done: ' >/dev/null; then
  cubelm_job_say "SIGUSR1 came after the last step: the run is complete"
  rc=0
fi
echo "$job_id exit $rc $(date +%s)" >>jobs.txt
cubelm_job_say "cubelm train ended with status $rc: $(cubelm_job_log | grep -E '^(done:|stopped early|cubelm: error)' | tail -n 1)"

# A stop before the time limit (75) continues in a new job.
if [ "$rc" = 75 ] && [ "${CUBELM_RESUBMIT:-0}" -gt 0 ] && [ -x submit.sh ]; then
  if next=$(CUBELM_RESUBMIT=$((CUBELM_RESUBMIT - 1)) ./submit.sh); then
    echo "$job_id resubmitted ${next%%;*} $(date +%s)" >>jobs.txt
    cubelm_job_say "resubmitted as job ${next%%;*} ($((CUBELM_RESUBMIT - 1)) more allowed)"
  else
    cubelm_job_say "error: resubmitting with submit.sh failed"
  fi
fi
exit "$rc"
