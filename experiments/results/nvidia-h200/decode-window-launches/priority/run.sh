#!/usr/bin/env bash
# +w128 windows launched at the greatest stream priority (KVQ_WINDOW_PRIORITY=1) against today's (0):
# one build, the modes interleaved, 3 rounds.
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
cmake -S . -B build-sw -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF "-DKVQ_TC_PAIRS=Int4:Int4;Int8:Int8;Bf16:Bf16" > "$R/build.log" 2>&1
cmake --build build-sw -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
mkdir -p "$R/runs"
for round in 1 2 3; do
  for mode in 0 1; do
    KVQ_WINDOW_PRIORITY=$mode build-sw/experiments/kvq bench --shapes "${SHAPES:-seed000|llama8b/B(1|8)/T1024|smollm2/B(1|64)/T1024}" --variant '^decode-tc$' \
      --schemes int4-g32-asym,int4-g32-asym+w128,int8-head,int8-head+w128,int4-head-asym,int4-head-asym+w128 \
      --csv "$R/runs/m${mode}_r$round.csv" > "$R/runs/m${mode}_r$round.log" 2>&1 || echo "mode $mode round $round failed"
  done
  echo "round $round at $((SECONDS - s)) s"
done
python3 - "$R/runs" << 'PY' | tee "$R/table.txt"
import csv, glob, re, statistics, sys
t = {}
for path in glob.glob(sys.argv[1] + "/m*_r*.csv"):
    m = int(re.search(r"/m(\d)_r", path).group(1))
    for row in csv.DictReader(open(path)):
        key = (row["shape"], int(row["B"]), int(row["T"]), row["k_scheme"])
        t.setdefault(key, {}).setdefault(m, []).append(float(row["median_us"]))
med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in t.items()}
print(f"{'case':<44} {'prio0':>8} {'prio1':>8} {'1/0':>6} {'plain':>8} {'w/plain 0':>9} {'w/plain 1':>9}")
for k in sorted(med):
    if "+w" not in k[3]: continue
    plain = (k[0], k[1], k[2], k[3].split("+w")[0])
    p = statistics.median(med[plain].values()) if plain in med else float("nan")
    a, b = med[k].get(0, float("nan")), med[k].get(1, float("nan"))
    print(f"{k[0]}/B{k[1]}/T{k[2]} {k[3]:<22} {a:8.2f} {b:8.2f} {b/a:6.3f} {p:8.2f} {a/p:9.3f} {b/p:9.3f}")
PY
tar -czf "$R/runs.tgz" -C "$R" runs && rm -rf "$R/runs"; gzip -f "$R/build.log"
