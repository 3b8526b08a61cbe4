#!/usr/bin/env bash
# groupthread held-segment + IntegerCoder (5 and 4 blocks an SM) against main's groupthread: gate, memcheck,
# bench-quantize interleaved (base, s2ca, held4) x 2 rounds.
set -uo pipefail
R=$OUT; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
cmake -S . -B build-gt -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF \
  -DKVQ_TC_TUNING= "-DKVQ_TC_PAIRS=Int8:Int8" > "$R/build.log" 2>&1
cmake --build build-gt -j "$(nproc)" --target kvq >> "$R/build.log" 2>&1 || { tail -40 "$R/build.log"; exit 1; }
echo "built in $((SECONDS - s)) s"
mkdir -p bins && cp build-gt/experiments/kvq bins/s2ca
cp gpu/quantize_groupthread.cu /tmp/gt_head.cu
cp .ab/variants/held4.cu gpu/quantize_groupthread.cu
cmake --build build-gt -j "$(nproc)" --target kvq >> "$R/build.log" 2>&1 || { tail -40 "$R/build.log"; exit 1; }
cp build-gt/experiments/kvq bins/held4
cp .ab/files/gpu/quantize_groupthread.cu gpu/quantize_groupthread.cu
cmake --build build-gt -j "$(nproc)" --target kvq >> "$R/build.log" 2>&1 || { tail -40 "$R/build.log"; exit 1; }
cp build-gt/experiments/kvq bins/base
cp /tmp/gt_head.cu gpu/quantize_groupthread.cu
echo "three binaries at $((SECONDS - s)) s"
for b in ${GATE:-s2ca held4}; do
  bins/$b validate --variant '^quantize-groupthread$' --report "$R/validate_$b.json" > "$R/validate_$b.txt" 2>&1
  echo "$b validate rc=$? at $((SECONDS - s)) s"; grep -c "\[FAIL\]" "$R/validate_$b.txt"; tail -4 "$R/validate_$b.txt"
  compute-sanitizer --tool memcheck bins/$b validate --variant '^quantize-groupthread$' --quick --report /tmp/m.json > "$R/memcheck_$b.txt" 2>&1
  echo "$b memcheck rc=$?"; tail -3 "$R/memcheck_$b.txt"
done
for round in 1 2; do for b in base s2ca held4; do
  bins/$b bench-quantize --variant '^quantize-groupthread$' --csv "$R/bq_${b}_$round.csv" > "$R/bq_${b}_$round.log" 2>&1 || echo "bench $b failed"
done; done
echo "benched at $((SECONDS - s)) s"
python3 - "$R" << 'PY' | tee "$R/ab.txt"
import csv, statistics, sys, glob
R = sys.argv[1]
t = {}
for f in glob.glob(f"{R}/bq_*_*.csv"):
    side = f.split("/bq_")[1].rsplit("_", 1)[0]
    for row in csv.DictReader(open(f)):
        k = (row["HKV"], row["scheme"] + (" (given)" if row["tensor_scale"] == "given" else ""), row["layout"])
        t.setdefault(k, {}).setdefault(side, []).append((float(row["median_us"]), float(row["pct_of_copy"])))
print(f"{'Hkv':>3} {'scheme':<18} {'layout':<7} {'base us (%copy)':>17} {'s2ca':>17} {'held4':>17} {'s2ca/b':>8} {'held4/b':>8}")
for k in sorted(t):
    m = {s: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for s, v in t[k].items()}
    if not all(s in m for s in ("base", "s2ca", "held4")): continue
    cell = lambda s: f"{m[s][0]:9.1f} ({m[s][1]:5.1f})"
    print(f"{k[0]:>3} {k[1]:<18} {k[2]:<7} {cell('base'):>17} {cell('s2ca'):>17} {cell('held4'):>17} {m['s2ca'][0]/m['base'][0]:8.3f} {m['held4'][0]/m['base'][0]:8.3f}")
PY
tar -czf "$R/runs.tgz" -C "$R" $(cd "$R" && ls bq_* validate_*.json build.log memcheck_* 2>/dev/null) && (cd "$R" && rm -f bq_* validate_*.json build.log memcheck_*)
