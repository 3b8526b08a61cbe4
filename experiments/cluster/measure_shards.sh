#!/usr/bin/env bash
# How a sharded sweep scales on this machine: one process against N shards, run one after another
# (the work sharding adds: process start, dump check, a layer's reference once per shard that holds
# part of it) and as a Slurm array on a one-node cluster of this machine (tests/cluster/local_slurm.sh;
# root) with one CPU per task (what Slurm adds: scheduling and starting each task). Prints a table.
# Usage: experiments/cluster/measure_shards.sh [KVQ_BINARY]   (docs/cluster.md has a run)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kvq=$(realpath "${1:-$root/build/experiments/kvq}")
work=$(mktemp -d /tmp/kvq-measure.XXXXXX)
source "$root/tests/cluster/local_slurm.sh"
trap 'local_slurm_stop; rm -rf "$work"' EXIT
pairs=(--k int8-head,int4-g32-asym,int4-head-asym --v int8-head,int4-g32-asym)
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }

# A compute-bound study: 4 layers, T = 4096, 1024 causal queries each, 6 pairs: 24 units.
"$kvq" synth --out "$work/long.h5" --layers 4 --tokens 4096 --q-len 1024 >/dev/null
t=$(now); OMP_NUM_THREADS=1 "$kvq" sweep "$work/long.h5" "${pairs[@]}" --no-latency --out "$work/single" >/dev/null
single=$(since "$t")
echo "| run | wall s | CPU-s summed over tasks | vs one process (1 thread) |"
echo "|---|---|---|---|"
printf "| one process, 1 thread | %.1f | %.1f | 1.00 |\n" "$single" "$single"
for n in 4 8 24; do
  "$kvq" plan sweep "$work/long.h5" "${pairs[@]}" --shards "$n" --out "$work/seq$n" >/dev/null
  sum=0
  for ((i = 0; i < n; i++)); do
    t=$(now); OMP_NUM_THREADS=1 "$kvq" sweep --plan "$work/seq$n/plan.json" --shard "$i" --out "$work/seq$n/shards/$i" >/dev/null 2>&1
    sum=$(echo "$sum + $(since "$t")" | bc)
  done
  printf "| %d shards one after another, 1 thread each | %.1f | %.1f | %.2f |\n" "$n" "$sum" "$sum" "$(echo "$sum / $single" | bc -l)"
done

if ! local_slurm_install; then echo "(no Slurm rows: $local_slurm_why)"; exit 0; fi
local_slurm_start
cpus=$(nproc)
export KVQ=$kvq
for n in 1 2 4 8 24; do
  "$kvq" plan sweep "$work/long.h5" "${pairs[@]}" --shards "$n" --out "$work/slurm$n" >/dev/null
  t=$(now)
  "$kvq" slurm submit "$work/slurm$n" >/dev/null
  jobs=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(','.join([a['job'] for a in d['arrays']] + [d['merge']['job']]))" "$work/slurm$n/slurm.json")
  local_slurm_wait "$jobs" 900
  wall=$(since "$t")
  [[ -f $work/slurm$n/results/sweep.csv ]] || { echo "the $n-shard study did not merge" >&2; exit 1; }
  cmp -s "$work/slurm$n/results/sweep.csv" "$work/single/sweep.csv" || { echo "the $n-shard study differs" >&2; exit 1; }
  cpu=$(python3 -c "import json,glob,sys; print(sum(r['seconds'] for f in glob.glob(sys.argv[1] + '/shards/*/shard.json') for r in json.load(open(f))))" "$work/slurm$n")
  printf "| Slurm array of %d + merge job, %d CPUs, 1 per task | %.1f | %.1f | %.2f (ideal %.2f) |\n" "$n" "$cpus" "$wall" \
    "$cpu" "$(echo "$wall / $single" | bc -l)" "$(echo "1 / $((cpus < n ? cpus : n))" | bc -l)"
done
# What Slurm alone costs a task: an array of tasks that do nothing, then a job after it.
t=$(now)
job=$(sbatch --parsable --array=0-15 --output=/dev/null --wrap=true)
after=$(sbatch --parsable --dependency=afterok:$job --output=/dev/null --wrap=true)
local_slurm_wait "$job,$after" 300
empty=$(since "$t")
printf "| Slurm array of 16 empty tasks + a job after it | %.1f | - | %.2f s per task on %d CPUs |\n" "$empty" \
  "$(echo "$empty * $cpus / 17" | bc -l)" "$cpus"
