# Starts one rank of a job of scripts/perf/job.sh: job.sh's launcher runs
#   bash scripts/perf/rank.sh CUBELM train deck.toml
# on every task. When the launcher did not bind the task to CPUs of its own (its
# affinity mask holds more CPUs than the task asked for: Slurm with
# TaskPlugin=task/none, say), OpenMP must not pin the threads either: every rank
# would pin its threads from the first CPU of the mask, all on the same cores
# (docs/launching.md). Then the threads stay unbound and rank 0 says so.
# shellcheck shell=bash
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
if [ "${OMP_PROC_BIND:-false}" != false ] && [ "$cpus" -gt "${CUBELM_TASK_CPUS:-$cpus}" ]; then
  export OMP_PROC_BIND=false
  unset OMP_PLACES
  if [ "${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}}" = 0 ]; then
    echo "rank.sh: the launcher did not bind the tasks ($cpus CPUs each, ${CUBELM_TASK_CPUS} asked for): OpenMP threads left unbound"
  fi
fi
exec "$@"
