#!/usr/bin/env bash
# kvq on a real Slurm: a one-node cluster on this machine (Debian's slurm-wlm and munge, daemons in
# the foreground, a generated slurm.conf in a temporary folder), then
#   1. `kvq slurm submit`: the bundled dump's sweep as an array of 4 shards plus the afterok merge job;
#      the merged files equal a single-process run (CSV byte for byte, JSON apart from host and time);
#   2. the two-line sbatch recipe on a longer sweep, one array task killed mid-run (scancel), its shard
#      re-submitted alone: it reuses the units the killed task had finished, runs the rest, and the
#      merge finds every unit exactly once and equals a single-process run;
#   3. a merge without one shard's folder fails naming the missing units and their shard.
# Skips (exit 77, one line) where it cannot have the daemons: not root, no apt-get, the install fails.
# Usage: slurm_cluster_test.sh KVQ_BINARY PYTHON
set -euo pipefail
kvq=$(realpath "${1:?usage: slurm_cluster_test.sh KVQ_BINARY PYTHON}")
python=${2:-python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "slurm_cluster: skipped: $*"; exit 77; }
fail() { echo "slurm_cluster: FAIL: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || skip "not root (the test starts munged, slurmctld and slurmd)"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null ||
   ! command -v sbatch >/dev/null; then
  command -v apt-get >/dev/null || skip "no apt-get to install slurm-wlm and munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/tmp/kvq-slurm-apt.log 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        slurm-wlm munge >/tmp/kvq-slurm-apt.log 2>&1; } ||
    skip "apt-get install slurm-wlm munge failed (see /tmp/kvq-slurm-apt.log)"
fi

started=$SECONDS
tmp=$(mktemp -d /tmp/kvq-slurm.XXXXXX)
chmod 711 "$tmp"
pids=()
stop() {  # whatever happened: cancel our jobs, then stop the daemons we started, by their pids
  set +e
  if [[ -n ${SLURM_CONF:-} ]] && ((${#pids[@]} > 1)); then
    scancel --full --quiet $(squeue -h -o %A 2>/dev/null | sort -u) 2>/dev/null
    for _ in $(seq 20); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.5; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap stop EXIT
trap 'exit 1' INT TERM

# munge: a key of our own, the socket in our folder.
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log" && chmod 711 "$tmp/munge"
mungekey -c -k "$tmp/munge/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$tmp/munge/munge.key" bs=128 count=1 status=none
chmod 600 "$tmp/munge/munge.key"
munged -F -f --socket="$tmp/munge/munge.sock" --key-file="$tmp/munge/munge.key" --pid-file="$tmp/munge/munged.pid" \
  --seed-file="$tmp/munge/munged.seed" --log-file="$tmp/log/munged.log" >"$tmp/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [[ -S $tmp/munge/munge.sock ]] && break; sleep 0.1; done
[[ -S $tmp/munge/munge.sock ]] || { cat "$tmp/log/munged.out"; fail "munged did not start"; }

host=$(hostname -s)
port=$((20000 + $$ % 20000 * 2))  # two ports of our own: another Slurm on this machine keeps its
memory=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
cat >"$tmp/slurm.conf" <<EOF
ClusterName=kvqtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=2
NodeName=$host CPUs=$(nproc) RealMemory=$memory State=UNKNOWN
PartitionName=kvq Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
show_logs() { tail -n 20 "$tmp"/log/*.log "$tmp"/log/*.out 2>/dev/null >&2 || true; }
for _ in $(seq 60); do [[ $(sinfo -h -o %t 2>/dev/null) == idle ]] && break; sleep 0.5; done
[[ $(sinfo -h -o %t 2>/dev/null) == idle ]] || { show_logs; fail "the node did not come up idle"; }
echo "slurm_cluster: one-node cluster up ($host, $(nproc) CPUs) in $((SECONDS - started)) s"

# Waits until none of the given jobs is in the queue (or fails after $2 seconds).
wait_jobs() {
  local jobs=$1 limit=$2 t0=$SECONDS
  while [[ -n $(squeue -h -j "$jobs" 2>/dev/null) ]]; do
    ((SECONDS - t0 < limit)) || { squeue >&2; show_logs; fail "jobs $jobs still queued after $limit s"; }
    sleep 0.5
  done
}
# Files equal to a single-process run: CSVs byte for byte, sweep.json apart from host and time fields.
same_results() {
  local merged=$1 single=$2
  for f in sweep.csv sweep_heads.csv; do cmp "$merged/$f" "$single/$f" || fail "$merged/$f differs from $single/$f"; done
  "$python" - "$merged/sweep.json" "$single/sweep.json" <<'EOF' || fail "$merged/sweep.json differs from $single/sweep.json"
import json, sys
host = {"hostname", "cpu", "threads", "time_utc"}
a, b = ([{k: v for k, v in r.items() if k not in host} for r in json.load(open(p))] for p in sys.argv[1:3])
if a != b:
    sys.exit(f"{a} != {b}")
EOF
}
cd "$root"

# 1. The bundled dump, 4 shards, through kvq slurm submit.
t0=$SECONDS
"$kvq" plan sweep data/dumps/stories260k.h5 --shards 4 --out "$tmp/study" >/dev/null
"$kvq" slurm submit "$tmp/study" >"$tmp/submit.log"
array=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['arrays'][0]['job'])" "$tmp/study/slurm.json")
merge=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['merge']['job'])" "$tmp/study/slurm.json")
wait_jobs "$array,$merge" 120
[[ -f $tmp/study/results/sweep.csv ]] || { cat "$tmp"/study/logs/* >&2; fail "the merge job wrote no results"; }
OMP_NUM_THREADS=1 "$kvq" sweep data/dumps/stories260k.h5 --no-latency --out "$tmp/single" >/dev/null
same_results "$tmp/study/results" "$tmp/single"
tasks=$("$python" -c "
import json, sys
m = json.load(open(sys.argv[1]))
tasks = {u['ran']['slurm']['array_task'] for u in m['unit_runs']}
assert m['units'] == 110 and len(m['unit_runs']) == 110, m['units']
assert all(u['ran']['slurm']['array_job'] == sys.argv[2] for u in m['unit_runs'])
print(len(tasks))" "$tmp/study/results/manifest.json" "$array")
[[ $tasks == 4 ]] || fail "expected the units of 4 array tasks in the manifest, got $tasks"
echo "slurm_cluster: [OK] 4-shard array + merge job = single-process sweep (110 units, 4 tasks) in $((SECONDS - t0)) s"

# 2. A longer sweep by the sbatch recipe; task 1 killed mid-run and re-submitted alone.
t0=$SECONDS
"$kvq" synth --out "$tmp/long.h5" --layers 4 --tokens 4096 --q-len 384 >/dev/null
"$kvq" plan sweep "$tmp/long.h5" --k int8-head,int4-g32-asym,int4-head-asym --v int8-head,int4-g32-asym --shards 4 \
  --out "$tmp/long" >/dev/null
export KVQ=$kvq
array=$(sbatch --parsable --array=0-3 --output="$tmp/long/%A_%a.out" scripts/slurm/sweep.sbatch "$tmp/long")
units=$tmp/long/shards/1/units
for _ in $(seq 240); do  # kill task 1 once it has finished a unit, while it runs the next
  (($(find "$units" -name '*.json' 2>/dev/null | wc -l) >= 1)) && break
  sleep 0.25
done
scancel "${array}_1"
wait_jobs "$array" 120
state=$(sacct -n -j "${array}_1" -o State 2>/dev/null | head -n 1 || true)
finished=$(find "$units" -name '*.json' | wc -l)
((finished >= 1 && finished < 6)) || fail "task 1 was to be killed mid-run: it left $finished of its 6 units"
"$kvq" merge "$tmp"/long/shards/* --out "$tmp/long/partial" >/dev/null 2>"$tmp/partial.err" &&
  fail "a merge with task 1's units missing succeeded"
grep -q "shard 1/4" "$tmp/partial.err" || fail "the failed merge did not name shard 1: $(cat "$tmp/partial.err")"
rerun=$(sbatch --parsable --array=1 --output="$tmp/long/%A_%a.out" scripts/slurm/sweep.sbatch "$tmp/long")
merge=$(sbatch --parsable --dependency=afterok:$rerun --output="$tmp/long/merge_%j.out" scripts/slurm/merge.sbatch "$tmp/long")
wait_jobs "$rerun,$merge" 120
[[ -f $tmp/long/results/sweep.csv ]] || { cat "$tmp"/long/*.out >&2; fail "the merge after the re-run wrote no results"; }
"$python" - "$tmp/long/shards/1/shard.json" "$finished" <<'EOF' || fail "the re-run of shard 1 did not resume"
import json, sys
runs, finished = json.load(open(sys.argv[1])), int(sys.argv[2])
assert len(runs) == 1, runs                     # the killed task never finished a run
assert len(runs[0]["reused"]) == finished, runs  # its units were kept ...
assert len(runs[0]["ran"]) == 6 - finished, runs  # ... and only the rest computed
assert not set(runs[0]["reused"]) & set(runs[0]["ran"]), runs
EOF
OMP_NUM_THREADS=2 "$kvq" sweep "$tmp/long.h5" --k int8-head,int4-g32-asym,int4-head-asym --v int8-head,int4-g32-asym \
  --no-latency --out "$tmp/long-single" >/dev/null
same_results "$tmp/long/results" "$tmp/long-single"
echo "slurm_cluster: [OK] task 1 killed (${state:-cancelled}) after $finished of 6 units; its re-run reused them, ran $((6 - finished)); merge = single-process sweep (24 units) in $((SECONDS - t0)) s"
echo "slurm_cluster: [OK] in $((SECONDS - started)) s"
