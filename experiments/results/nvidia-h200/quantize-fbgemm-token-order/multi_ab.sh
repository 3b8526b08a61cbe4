#!/usr/bin/env bash
# Quantize A/B over N variants in one build dir: this tree = "head"; each .ab/variants/NAME/ holds files laid
# over it (NAME=base is the reference). Env: SCHEMES, VARIANT, INPUT, ROUNDS, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?}; mkdir -p "$OUT"
b=build-m
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON_MODULE=OFF \
  "-DKVQ_TC_PAIRS=Int4:Int4" -DKVQ_TC_TUNING= > "$OUT/build.log" 2>&1
s=$SECONDS; cmake --build $b -j "$(nproc)" --target kvq >> "$OUT/build.log" 2>&1; echo "head built $((SECONDS-s)) s" >&2
mkdir -p bins; cp $b/experiments/kvq bins/head
sides=(head)
for d in .ab/variants/*/; do
  name=$(basename "$d"); saved=$(mktemp -d)
  files=$(cd "$d" && find . -type f | sed 's|^\./||')
  for f in $files; do mkdir -p "$saved/$(dirname "$f")"; cp "$f" "$saved/$f"; cp "$d/$f" "$f"; done
  s=$SECONDS; cmake --build $b -j "$(nproc)" --target kvq >> "$OUT/build_$name.log" 2>&1; echo "$name built $((SECONDS-s)) s" >&2
  cp $b/experiments/kvq "bins/$name"; sides+=("$name")
  for f in $files; do cp "$saved/$f" "$f"; done
done
cmake --build $b -j "$(nproc)" --target kvq > /dev/null 2>&1  # head again (validate uses it)
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in "${sides[@]}"; do
    echo "round $r $side" >&2
    "bins/$side" bench-quantize --schemes "${SCHEMES:-.}" --variant "${VARIANT:-.}" --input "${INPUT:-uniform,gaussian-rows}" \
      --csv "$OUT/ab_${side}_$r.csv" > "$OUT/ab_${side}_$r.log" 2>&1
  done
done
python3 - "$OUT" "${ROUNDS:-2}" "${sides[@]}" << 'PY' | tee "$OUT/ab.txt"
import csv, statistics, sys
sys.path.insert(0, "experiments/bench")
from compare_runs import label, row_key
out, rounds, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ex = {}
def rows(side):
    t = {}
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{out}/ab_{side}_{r}.csv")):
            k = row_key("quantize", row); t.setdefault(k, []).append(float(row["median_us"])); ex.setdefault(k, row)
    return {k: statistics.median(v) for k, v in t.items()}
t = {s: rows(s) for s in sides}
ref = "base" if "base" in sides else sides[0]
others = [s for s in sides if s != ref]
print(f"{'case':<78} {ref+' us':>10} " + " ".join(f"{s+'/'+ref:>14}" for s in others))
for k in sorted(t[ref]):
    print(f"{label(k, ex[k]):<78} {t[ref][k]:10.2f} " + " ".join(f"{t[s][k]/t[ref][k]:14.3f}" for s in others))
PY
(cd "$OUT" && tar -czf ab_runs.tgz ab_*_*.csv ab_*_*.log build*.log && rm -f ab_*_*.csv ab_*_*.log)
