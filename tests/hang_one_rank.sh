#!/usr/bin/env bash
# Stops one rank of a running MPI job with SIGSTOP and checks what the job does
# then (the hang watchdog, docs/reliability.md).
#
#   hang_one_rank.sh abort  RANK LIMIT -- MPIEXEC ... cubelm train DECK
#   hang_one_rank.sh resume RANK HOLD  -- MPIEXEC ... cubelm train DECK
#
# Both start the command, wait for its first "step " line and stop world rank
# RANK (the process among the command's descendants whose environment says
# PMIX_RANK, OMPI_COMM_WORLD_RANK or PMI_RANK = RANK).
#   abort:  the job must end with a non-zero status within LIMIT seconds of the
#           SIGSTOP, and every rank process must be gone (the stopped one too).
#   resume: the job must still run HOLD seconds later; the rank is then
#           continued and the job must finish with status 0.
# The job's output comes first, then one verdict line: "hang_one_rank: ok: ..."
# or "hang_one_rank: FAIL: ..." (exit status 0 or 1). A job that outlives its
# limit is killed, so a broken watchdog fails the test instead of hanging it.
set -u

usage() {
  echo "usage: $0 abort RANK LIMIT -- COMMAND... | $0 resume RANK HOLD -- COMMAND..." >&2
  exit 2
}
[ $# -ge 5 ] && [ "$4" = "--" ] || usage
mode=$1 rank=$2 seconds=$3
shift 4
case $mode in abort | resume) ;; *) usage ;; esac

out=$(mktemp "${TMPDIR:-/tmp}/hang_one_rank.XXXXXX")
job=""
ranks=""
stopped=""
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# Every process below $1 (children first found through ps, breadth first).
descendants() {
  ps -e -o pid=,ppid= | awk -v root="$1" '
    { parent[$1] = $2; pids[NR] = $1 }
    END {
      want[root] = 1
      do {
        added = 0
        for (i in pids) {
          p = pids[i]
          if (!(p in want) && (parent[p] in want)) { want[p] = 1; added = 1 }
        }
      } while (added)
      for (p in want) if (p != root) print p
    }'
}

# The world rank of process $1 from its environment, or nothing.
rank_of() {
  tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null |
    awk -F= '$1 == "PMIX_RANK" || $1 == "OMPI_COMM_WORLD_RANK" || $1 == "PMI_RANK" { print $2; exit }'
}

# A process that has exited (or is a zombie waiting for its parent) is gone.
gone() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 0
  case $state in Z*) return 0 ;; *) return 1 ;; esac
}

finish() {
  local verdict=$1 rc=$2
  if alive "$job"; then
    [ -n "$stopped" ] && kill -CONT "$stopped" 2>/dev/null
    kill -KILL -- "-$job" 2>/dev/null || kill -KILL "$job" 2>/dev/null
    for p in $ranks; do kill -KILL "$p" 2>/dev/null; done
    wait "$job" 2>/dev/null
  fi
  cat "$out"
  rm -f "$out"
  echo "hang_one_rank: $verdict"
  exit "$rc"
}

# Its own process group, so that a job left running can be killed as a whole.
set -m
"$@" >"$out" 2>&1 &
job=$!
set +m

start=$(now)
until grep -q '^step ' "$out"; do
  alive "$job" || finish "FAIL: the job ended before its first step" 1
  awk -v s="$(since "$start")" 'BEGIN { exit !(s > 120) }' &&
    finish "FAIL: no step line within 120 s" 1
  sleep 0.05
done

for p in $(descendants "$job"); do
  r=$(rank_of "$p")
  [ -n "$r" ] || continue
  ranks="$ranks $p"
  [ "$r" = "$rank" ] && stopped=$p
done
[ -n "$stopped" ] || finish "FAIL: no process of rank $rank among the job's processes" 1
kill -STOP "$stopped" || finish "FAIL: cannot stop pid $stopped" 1
stop_time=$(now)

if [ "$mode" = abort ]; then
  while alive "$job"; do
    if awk -v s="$(since "$stop_time")" -v l="$seconds" 'BEGIN { exit !(s > l) }'; then
      finish "FAIL: the job still runs $seconds s after rank $rank (pid $stopped) was stopped" 1
    fi
    sleep 0.05
  done
  wait "$job"
  status=$?
  took=$(since "$stop_time")
  [ "$status" -ne 0 ] || finish "FAIL: the job exited with status 0 after rank $rank was stopped" 1
  # The launcher reaps its ranks as it ends; allow it a moment.
  for p in $ranks; do
    for _ in $(seq 50); do
      gone "$p" && break
      sleep 0.1
    done
    gone "$p" || finish "FAIL: rank process $p still exists after the job ended" 1
  done
  finish "ok: rank $rank (pid $stopped) stopped; the job exited with status $status $took s later (limit $seconds s); all $(echo $ranks | wc -w) rank processes are gone" 0
fi

sleep "$seconds"
alive "$job" || finish "FAIL: the job ended while rank $rank was stopped for $seconds s" 1
kill -CONT "$stopped"
stopped=""
resumed=$(now)
while alive "$job"; do
  if awk -v s="$(since "$resumed")" 'BEGIN { exit !(s > 120) }'; then
    finish "FAIL: the job did not finish within 120 s after rank $rank was continued" 1
  fi
  sleep 0.1
done
wait "$job"
status=$?
[ "$status" -eq 0 ] || finish "FAIL: the job exited with status $status after rank $rank was continued" 1
finish "ok: rank $rank stopped for $seconds s, then continued; the job finished with status 0" 0
