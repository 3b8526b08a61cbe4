#!/usr/bin/env bash
# bf16 split counts at the shapes whose split's CTAs exceed the SMs (the one-split rule of 5831952 was
# timed at B >= 64 / 256 only), cuDNN in the same run.
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
cmake -S . -B build-sw -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF "-DKVQ_TC_PAIRS=Int4:Int4;Int8:Int8;Bf16:Bf16" > "$R/build.log" 2>&1
cmake --build build-sw -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
SH='seed000/B(32|64|128)/|llama8b/B(8|64)/|smollm2/B(8|64)/T8192'
timeout 120 python3 experiments/bench/bench_peers.py --peers '^cudnn$' --shapes "$SH" --out "$R/peers.csv" > "$R/peers.log" 2>&1
echo "peers rc=$? at $((SECONDS - s)) s"
OUT=$R/sw KVQ=build-sw/experiments/kvq KVQ_SPLITS="0 1 2 3 4 6" KVQ_ROUNDS=2 KVQ_SCHEMES=bf16 KVQ_SHAPES="$SH" \
  timeout 300 bash experiments/bench/sweep_splits.sh > /dev/null 2> "$R/sweep.err"
echo "sweep rc=$? at $((SECONDS - s)) s"
cat "$R/sw/sweep.txt"
python3 - "$R/peers.csv" "$R/sw" <<'PY'
import csv, glob, statistics, sys
cud = {}
for r in csv.DictReader(open(sys.argv[1])):
    cud[(r['shape'], int(r['B']), int(r['T']))] = float(r['median_us'])
t = {}
for path in glob.glob(sys.argv[2] + "/s0_r*.csv"):
    for r in csv.DictReader(open(path)):
        t.setdefault((r['shape'], int(r['B']), int(r['T'])), []).append(float(r['median_us']))
for k in sorted(t):
    c = cud.get(k)
    print(f"{k[0]}/B{k[1]}/T{k[2]}: planned bf16 {statistics.median(t[k]):.2f} us, cuDNN {c}, ratio {statistics.median(t[k]) / c if c else float('nan'):.3f}")
PY
tar -czf "$R/sw.tgz" -C "$R" sw && rm -rf "$R/sw"; gzip -f "$R/build.log" "$R/peers.log"
