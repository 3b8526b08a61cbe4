#!/usr/bin/env bash
# The +wW window tail with every (K, V) pair built: registers / stack per kernel, the gate (decode-tc)
# and memcheck, then windowed against plain schemes in the same binary (2 rounds).
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
cmake -S . -B build-full -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF > "$R/build.log" 2>&1
cmake --build build-full -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
k=build-full/experiments/kvq
cuobjdump -res-usage $k > "$R/res_head.txt" 2>&1
start=$SECONDS
$k validate --variant '^decode-tc$' --report "$R/validate_decode_tc.json" > "$R/validate.log" 2>&1
echo "validate rc=$? in $((SECONDS - start)) s"
grep -c "\[OK\]" "$R/validate.log"; grep "\[FAIL\]" "$R/validate.log" | head -20; tail -2 "$R/validate.log"
start=$SECONDS
compute-sanitizer --tool memcheck --error-exitcode 9 $k validate --variant '^decode-tc$' --quick --report "$R/memcheck.json" > "$R/memcheck.log" 2>&1
echo "memcheck rc=$? in $((SECONDS - start)) s"; grep -c "\[OK\]" "$R/memcheck.log"; grep "ERROR SUMMARY\|FAIL" "$R/memcheck.log" | tail -3
mkdir -p "$R/bench"
for round in 1 2; do
  $k bench --shapes 'seed000/|llama8b/B(1|8)/T1024|smollm2/B(1|64)/T1024' --variant '^decode-tc$' \
    --schemes bf16,int4-g32-asym,int4-g32-asym+w128,int8-head,int8-head+w128,int4-head-asym,int4-head-asym+w128 \
    --csv "$R/bench/r$round.csv" > "$R/bench/r$round.log" 2>&1 || echo "bench round $round failed"
done
echo "bench done at $((SECONDS - s)) s"
python3 - "$R/bench" << 'PY' | tee "$R/windows.txt"
import csv, glob, statistics, sys
t = {}
for path in glob.glob(sys.argv[1] + "/r*.csv"):
    for row in csv.DictReader(open(path)):
        t.setdefault((row["shape"], int(row["B"]), int(row["T"]), row["k_scheme"]), []).append(float(row["median_us"]))
med = {k: statistics.median(v) for k, v in t.items()}
print(f"{'case':<28} {'scheme':<20} {'plain us':>9} {'+w128 us':>9} {'+w/plain':>9}")
for k in sorted(med):
    if "+w" not in k[3]: continue
    plain = med.get((k[0], k[1], k[2], k[3].split('+w')[0]))
    if plain: print(f"{k[0]}/B{k[1]}/T{k[2]:<14} {k[3].split('+w')[0]:<20} {plain:9.2f} {med[k]:9.2f} {med[k] / plain:9.3f}")
print("bf16:", ", ".join(f"{k[0]}/B{k[1]}/T{k[2]} {v:.2f}" for k, v in sorted(med.items()) if k[3] == "bf16"))
PY
tar -czf "$R/bench.tgz" -C "$R" bench && rm -rf "$R/bench"
gzip -f "$R"/*.json "$R"/*.log "$R"/res_head.txt
