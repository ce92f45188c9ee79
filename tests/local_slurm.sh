# A throwaway single-node Slurm for tests: munged, slurmctld and slurmd started as
# plain background processes with everything (configuration, munge key and
# socket, state, logs) in one directory, free ports, and SLURM_CONF pointing at
# it, so that nothing of the machine's own Slurm or munge is touched. Needs root
# (slurmd runs jobs as their users) and Debian's slurmctld, slurmd, slurm-client
# and munge (bookworm: Slurm 22.05).
#
#   source tests/local_slurm.sh
#   local_slurm_missing            prints the programs that are missing (nothing: all there)
#   local_slurm_start DIR CPUS     starts the daemons (CPUS: CPUs the node claims;
#                                  more than it has lets jobs oversubscribe), waits
#                                  until the node is idle, exports SLURM_CONF
#   local_slurm_stop               stops them by PID (safe to call twice)
#
# local_slurm_start also starts a guard that stops the daemons if the calling
# shell dies without calling local_slurm_stop (killed by a test timeout).
# shellcheck shell=bash

LOCAL_SLURM_PIDS=()
LOCAL_SLURM_GUARD=

local_slurm_missing() {
  local c missing=()
  for c in munged slurmctld slurmd sbatch srun scontrol squeue sinfo; do
    command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || missing+=("$c")
  done
  echo "${missing[*]}"
}

local_slurm_start() {
  local dir=$1 cpus=$2 host ports p
  PATH=$PATH:/usr/sbin
  host=$(hostname -s)
  mkdir -p "$dir"/{etc,munge,key,state/ctld,state/d,log,run}
  # munged wants a socket directory all may enter and a key only its owner reads.
  chmod 755 "$dir" "$dir/munge"
  chmod 700 "$dir/key"
  head -c 1024 /dev/urandom >"$dir/key/munge.key"
  chmod 400 "$dir/key/munge.key"
  read -r -a ports < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("", 0))
print(*[x.getsockname()[1] for x in s])')
  cat >"$dir/etc/slurm.conf" <<EOF
# Throwaway single-node Slurm of cubelm's tests (tests/local_slurm.sh)
ClusterName=cubelmtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldPort=${ports[0]}
SlurmdPort=${ports[1]}
StateSaveLocation=$dir/state/ctld
SlurmdSpoolDir=$dir/state/d
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
# The node claims $cpus CPUs whatever it has, so that jobs of more tasks than
# cores run (oversubscribed) instead of pending for ever; config_overrides makes
# slurmd accept the difference.
SlurmdParameters=config_overrides
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$dir/etc/slurm.conf
  munged --foreground --socket="$dir/munge/munge.socket" --key-file="$dir/key/munge.key" \
    --log-file="$dir/log/munged.log" --pid-file="$dir/run/munged.pid" \
    --seed-file="$dir/run/munged.seed" >"$dir/log/munged.out" 2>&1 &
  LOCAL_SLURM_PIDS+=($!)
  for _ in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
  [ -S "$dir/munge/munge.socket" ] || { cat "$dir/log/munged.out" >&2; echo "munged did not start" >&2; return 1; }
  slurmctld -D -i >"$dir/log/slurmctld.out" 2>&1 &
  LOCAL_SLURM_PIDS+=($!)
  slurmd -D >"$dir/log/slurmd.out" 2>&1 &
  LOCAL_SLURM_PIDS+=($!)
  # The guard: stops the daemons once this shell is gone.
  (
    trap '' INT
    parent=$$
    while kill -0 "$parent" 2>/dev/null; do sleep 1; done
    kill "${LOCAL_SLURM_PIDS[@]}" 2>/dev/null
  ) >/dev/null 2>&1 &
  LOCAL_SLURM_GUARD=$!
  for _ in $(seq 150); do
    [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && return 0
    sleep 0.2
  done
  for p in slurmctld slurmd; do echo "--- $dir/log/$p.log" >&2; tail -n 20 "$dir/log/$p.log" >&2; done
  echo "the local Slurm's node did not become idle within 30 s" >&2
  return 1
}

local_slurm_stop() {
  local p
  [ ${#LOCAL_SLURM_PIDS[@]} -gt 0 ] || return 0
  # Jobs still in the queue (a test that failed half-way) end first.
  if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null
    for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  # slurmd first (it ends its job steps), then slurmctld, then munged
  for p in "${LOCAL_SLURM_PIDS[2]:-}" "${LOCAL_SLURM_PIDS[1]:-}" "${LOCAL_SLURM_PIDS[0]:-}"; do
    [ -n "$p" ] || continue
    kill "$p" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  [ -n "$LOCAL_SLURM_GUARD" ] && kill "$LOCAL_SLURM_GUARD" 2>/dev/null
  LOCAL_SLURM_PIDS=()
  LOCAL_SLURM_GUARD=
}
