#!/usr/bin/env bash
# Every pair built: the decode-tc gate, memcheck over the quick gate, and int4-head-asym / bf16 beside cuDNN.
set -uo pipefail
R=$OUT
mkdir -p "$R/full"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
c=${HEAD_COMMIT:-f2fddf5}
KVQ_COMMIT=$c cmake -S . -B build-full -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF -DKVQ_TC_TUNING= > "$R/full/build.log" 2>&1
KVQ_COMMIT=$c cmake --build build-full -j 16 --target kvq >> "$R/full/build.log" 2>&1 || { tail -20 "$R/full/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"; grep -c "spill" "$R/full/build.log"; grep "decode_tc.*spill" "$R/full/build.log" | head -3
k=build-full/experiments/kvq
$k validate --variant '^decode-tc$' > "$R/full/validate.txt" 2>&1; echo "gate rc=$? at $((SECONDS - s)) s"; grep "decode-tc:" "$R/full/validate.txt" | tail -2
grep '^\[FAIL\]' "$R/full/validate.txt" | head -5
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 $k validate --quick --variant '^decode-tc$' > "$R/full/memcheck.txt" 2>&1
echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY" "$R/full/memcheck.txt" | tail -1; grep "decode-tc:" "$R/full/memcheck.txt" | tail -1
KVQ_COMMIT=$c timeout 100 python3 experiments/bench/bench_peers.py --peers '^cudnn$' --shapes 'seed000|llama8b/B(8|64)/' --out "$R/full/peers.csv" > "$R/full/peers.log" 2>&1
echo "peers rc=$? at $((SECONDS - s)) s"
KVQ_COMMIT=$c $k bench --variant '^decode-tc$' --shapes 'seed000|llama8b/B(8|64)/' --schemes bf16,int4-head-asym,int4-g32-asym \
  --peers "$R/full/peers.csv" --csv "$R/full/decode.csv" > "$R/full/bench.log" 2>&1
echo "bench rc=$? at $((SECONDS - s)) s"
python3 - "$R/full/decode.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r['kernel'] == 'decode-tc':
        print(f"{r['k_scheme']:<16} {r['shape']}/B{r['B']}/T{r['T']:<6} s{r['splits']:<3} {float(r['median_us']):8.2f} us  {float(r['pct_of_read']):5.1f}% read  vs_cudnn {r['vs_cudnn']}")
PY
gzip -f "$R"/full/*.log "$R/full/validate.txt" "$R/full/memcheck.txt"; tar -czf "$R/full.tgz" -C "$R" full && rm -rf "$R/full"
