#!/usr/bin/env bash
# Every split count of decode-tc at the chosen shapes, one build: `kvq bench --splits N` for each N
# (0: the planner's own count), KVQ_ROUNDS rounds in turn, then per case the planner's count and time
# beside the best count's. The split-count rules in gpu/decode_plan.cu are judged by such sweeps
# (experiments/results/nvidia-h100-80gb-hbm3/decode-split-counts/).
#
#   OUT=results/splits KVQ_SHAPES='smollm2/B(1|8)/' KVQ_SCHEMES=bf16,int8-head bash experiments/bench/sweep_splits.sh
#
# KVQ (default build-gpu/experiments/kvq), KVQ_SPLITS (default "0 1 2 3 4 6 8 12 16 24 32 48 64"), KVQ_ROUNDS
# (default 2). A count asked that the kernel's whole rounds of steps cut short runs its last splits empty.
# Writes $OUT/s<N>_r<round>.csv and $OUT/sweep.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/splits}
kvq=${KVQ:-build-gpu/experiments/kvq}
[[ -x $kvq ]] || { echo "sweep_splits: $kvq: no kvq binary (build it, or set KVQ)" >&2; exit 2; }
mkdir -p "$OUT"
splits=${KVQ_SPLITS:-0 1 2 3 4 6 8 12 16 24 32 48 64}
for round in $(seq 1 "${KVQ_ROUNDS:-2}"); do
  for n in $splits; do
    echo "sweep_splits: round $round, --splits $n" >&2
    "$kvq" bench --shapes "${KVQ_SHAPES:-smollm2/B(1|8)/}" --variant '^decode-tc$' --schemes "${KVQ_SCHEMES:-bf16,int8-head}" \
      --splits "$n" --csv "$OUT/s${n}_r$round.csv" > "$OUT/s${n}_r$round.log"
  done
done
python3 - "$OUT" << 'PY' | tee "$OUT/sweep.txt"
import csv, glob, re, statistics, sys
out = sys.argv[1]
times, planned = {}, {}
for path in glob.glob(f"{out}/s*_r*.csv"):
    n = int(re.search(r"/s(\d+)_r\d+\.csv$", path).group(1))
    for row in csv.DictReader(open(path)):
        key = (row["shape"], int(row["B"]), int(row["T"]), f"{row['k_scheme']}/{row['v_scheme']}", row["layout"] or "-")
        times.setdefault(key, {}).setdefault(n, []).append(float(row["median_us"]))
        if n == 0:
            planned[key] = int(row["splits"])
print(f"{'case':<52} {'planned':>7} {'us':>8} {'best':>4} {'us':>8} {'planned/best':>12}")
for key in sorted(times):
    us = {n: statistics.median(v) for n, v in times[key].items()}
    best_us, best = min((t, n) for n, t in us.items() if n)
    label = f"{key[0]}/B{key[1]}/T{key[2]} {key[3]} {key[4]}"
    if 0 in us:
        print(f"{label:<52} {planned[key]:>7} {us[0]:8.2f} {best:>4} {best_us:8.2f} {us[0] / best_us:12.3f}")
    print("    " + " ".join(f"{n}:{t:.1f}" for n, t in sorted(us.items()) if n))
PY
