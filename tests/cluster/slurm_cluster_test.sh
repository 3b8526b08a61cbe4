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
# The cluster: local_slurm.sh.
# Usage: slurm_cluster_test.sh KVQ_BINARY PYTHON
set -euo pipefail
kvq=$(realpath "${1:?usage: slurm_cluster_test.sh KVQ_BINARY PYTHON}")
python=${2:-python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "slurm_cluster: skipped: $*"; exit 77; }
fail() { echo "slurm_cluster: FAIL: $*" >&2; exit 1; }

source "$root/tests/cluster/local_slurm.sh"
local_slurm_install || skip "$local_slurm_why"
started=$SECONDS
trap local_slurm_stop EXIT
trap 'exit 1' INT TERM
local_slurm_start || fail "could not start the one-node cluster"
tmp=$local_slurm_dir
echo "slurm_cluster: one-node cluster up ($(hostname -s), $(nproc) CPUs) in $((SECONDS - started)) s"
wait_jobs() { local_slurm_wait "$1" "$2" || fail "jobs $1 did not finish"; }
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
# Kill task 1 once it has finished a unit (a unit file gets its final name, *.json, only when whole),
# while it runs the next.
deadline=$((SECONDS + 300))
until (($(find "$units" -name '*.json' 2>/dev/null | wc -l) >= 1)); do
  ((SECONDS < deadline)) || fail "task 1 finished no unit within 300 s"
  sleep 0.25
done
scancel "${array}_1"
wait_jobs "$array" 120

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
echo "slurm_cluster: [OK] task 1 killed (scancel) after $finished of 6 units; its re-run reused them, ran $((6 - finished)); merge = single-process sweep (24 units) in $((SECONDS - t0)) s"
echo "slurm_cluster: [OK] in $((SECONDS - started)) s"
