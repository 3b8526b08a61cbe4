#!/usr/bin/env bash
# Where a +w128 window's time goes at small batches: the regions' launches forked (as on main), serial,
# one region alone, each with and without the merge kernel (KVQ_NO_MERGE), beside the plain scheme.
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
cmake -S . -B build-sw -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVQ_PYTHON_MODULE=OFF "-DKVQ_TC_PAIRS=Int4:Int4;Int8:Int8;Bf16:Bf16" > "$R/build.log" 2>&1
cmake --build build-sw -j 16 --target kvq >> "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
echo "built at $((SECONDS - s)) s"
mkdir -p "$R/runs"
SH='llama8b/B(1|8)/T1024|llama8b/B1/T8192|smollm2/B(1|64)/T1024|seed000/B32/'
for round in 1 2; do
  for mode in fork serial quantized-only window-only; do
    for nm in 0 1; do
      env KVQ_WINDOW_LAUNCH=$mode $( [[ $nm == 1 ]] && echo KVQ_NO_MERGE=1 ) build-sw/experiments/kvq bench --shapes "$SH" --variant '^decode-tc$' \
        --schemes int4-g32-asym,int4-g32-asym+w128,int8-head,int8-head+w128 \
        --csv "$R/runs/${mode}_nm${nm}_r$round.csv" > "$R/runs/${mode}_nm${nm}_r$round.log" 2>&1 || echo "$mode $nm $round failed"
    done
  done
  echo "round $round at $((SECONDS - s)) s"
done
python3 - "$R/runs" << 'PY' | tee "$R/table.txt"
import csv, glob, os, re, statistics, sys
t = {}
for path in glob.glob(sys.argv[1] + "/*_r*.csv"):
    mode = re.sub(r"_r\d+\.csv$", "", os.path.basename(path))
    for row in csv.DictReader(open(path)):
        t.setdefault((row["shape"], int(row["B"]), int(row["T"]), row["k_scheme"]), {}).setdefault(mode, []).append(float(row["median_us"]))
modes = ["fork_nm0", "fork_nm1", "serial_nm0", "serial_nm1", "quantized-only_nm0", "quantized-only_nm1", "window-only_nm0", "window-only_nm1"]
print(f"{'case (us)':<40} {'plain':>7} " + " ".join(f"{m:>18}" for m in modes))
for k in sorted(t):
    if "+w" not in k[3]: continue
    plain = statistics.median(t[(k[0], k[1], k[2], k[3].split('+w')[0])]["fork_nm0"])
    print(f"{k[0]}/B{k[1]}/T{k[2]} {k[3]:<20} {plain:7.2f} " + " ".join(f"{statistics.median(t[k][m]):18.2f}" for m in modes))
PY
tar -czf "$R/runs.tgz" -C "$R" runs && rm -rf "$R/runs"; gzip -f "$R/build.log"
