#!/usr/bin/env bash
# Split counts at the small grids (one split's CTAs fit on the SMs: long steps for bf16), bf16, int8-head and
# int4-head-asym, cuDNN in the same run: does the one-CTA-an-SM count still win with 32-key steps?
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
cmake -S . -B build-sw -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF "-DKVQ_TC_PAIRS=Int4:Int4;Int8:Int8;Bf16:Bf16" > "$R/build.log" 2>&1
cmake --build build-sw -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
SH='llama8b/B(1|8)/T(1024|8192)|smollm2/B(1|8)/'
timeout 100 python3 experiments/bench/bench_peers.py --peers '^cudnn$' --shapes "$SH" --out "$R/peers.csv" > "$R/peers.log" 2>&1
echo "peers rc=$? at $((SECONDS - s)) s"
OUT=$R/sw KVQ=build-sw/experiments/kvq KVQ_SPLITS="0 2 4 6 8 12 16 24 32" KVQ_ROUNDS=2 KVQ_SCHEMES=bf16,int8-head,int4-head-asym KVQ_SHAPES="$SH" \
  timeout 330 bash experiments/bench/sweep_splits.sh > /dev/null 2> "$R/sweep.err"
echo "sweep rc=$? at $((SECONDS - s)) s"
cat "$R/sw/sweep.txt"
python3 - "$R/peers.csv" "$R/sw" <<'PY'
import csv, glob, statistics, sys
cud = {(r['shape'], int(r['B']), int(r['T'])): float(r['median_us']) for r in csv.DictReader(open(sys.argv[1]))}
t = {}
for path in glob.glob(sys.argv[2] + "/s*_r*.csv"):
    n = int(path.split("/s")[-1].split("_")[0])
    for r in csv.DictReader(open(path)):
        t.setdefault((r['shape'], int(r['B']), int(r['T']), r['k_scheme']), {}).setdefault(n, []).append(float(r['median_us']))
for k in sorted(t):
    c = cud.get(k[:3])
    us = {n: statistics.median(v) for n, v in t[k].items()}
    best = min(v for n, v in us.items() if n)
    print(f"{k[0]}/B{k[1]}/T{k[2]} {k[3]:<16} cuDNN {c:7.2f}  planned {us[0] / c:.3f}  best {best / c:.3f}")
PY
tar -czf "$R/sw.tgz" -C "$R" sw && rm -rf "$R/sw"; gzip -f "$R/build.log" "$R/peers.log"
