#!/usr/bin/env bash
# A/B on one GPU machine: builds a base tree and this one, then times the same decode cases with each,
# interleaved (base, this, base, this) so that clock and thermal drift fall on both alike, and prints
# this / base per row. Committed runs come from other machines; a slowdown of a few percent needs this.
#
#   git archive e7be665 | (mkdir -p .ab/base && tar -x -C .ab/base)     # where git is; .ab/ is ignored
#   OUT=... KVQ_SHAPES='llama8b/B1/' KVQ_SCHEMES=bf16,int8-head bash scripts/device_ab.sh .ab/base
#
# KVQ_SHAPES, KVQ_SCHEMES, KVQ_DECODE_VARIANTS (default ^decode-tc$) narrow the cases; KVQ_AB_ROUNDS
# (default 2) sets the interleaved rounds. KVQ_AB_BENCH=quantize times `kvq bench-quantize` instead
# (KVQ_SCHEMES its --schemes regex). Writes $OUT/ab_<side>_<round>.csv and $OUT/ab.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/device_ab.sh BASE_TREE}
[[ -f $base/CMakeLists.txt ]] || { echo "device_ab: $base: not a kvq tree (no CMakeLists.txt)" >&2; exit 2; }
OUT=${OUT:-results/ab}
mkdir -p "$OUT"
build() {  # build SRC DIR
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
        -DKVQ_PYTHON_MODULE=OFF > "$OUT/build_$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j "$(nproc)" --target kvq >> "$OUT/build_$(basename "$2").log" 2>&1
}
echo "device_ab: building the base ($base) and this tree" >&2
build "$base" build-ab-base & pid=$!
build . build-ab-head
wait $pid
bench=${KVQ_AB_BENCH:-decode}
case $bench in
  decode) args=(bench --shapes "${KVQ_SHAPES:-llama8b/B1/}" --variant "${KVQ_DECODE_VARIANTS:-^decode-tc\$}")
          [[ -n ${KVQ_SCHEMES:-} ]] && args+=(--schemes "$KVQ_SCHEMES") ;;
  quantize) args=(bench-quantize --schemes "${KVQ_SCHEMES:-.}") ;;
  *) echo "device_ab: KVQ_AB_BENCH=$bench: expected decode or quantize" >&2; exit 2 ;;
esac
for round in $(seq 1 "${KVQ_AB_ROUNDS:-2}"); do
  for side in base head; do
    echo "device_ab: round $round, $side" >&2
    "build-ab-$side/experiments/kvq" "${args[@]}" --csv "$OUT/ab_${side}_${round}.csv" > "$OUT/ab_${side}_${round}.log"
  done
done
python3 - "$OUT" "${KVQ_AB_ROUNDS:-2}" "$bench" << 'EOF' | tee "$OUT/ab.txt"
import csv, statistics, sys
out, rounds, bench = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def key_of(row):
    if bench == "quantize":
        return (row["scheme"], row["layout"], row["variant"], "Hkv" + row["HKV"])
    return (row["shape"], row["B"], row["T"], row["kernel"], row["k_scheme"], row["v_scheme"], row.get("layout", ""))
def label_of(key):
    if bench == "quantize":
        return " ".join(key)
    return f"{key[3]} {key[4]}/{key[5]} {key[0]}/B{key[1]}/T{key[2]}" + (f" [{key[6]}]" if key[6] else "")
def rows(side):
    t = {}
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{out}/ab_{side}_{r}.csv")):
            t.setdefault(key_of(row), []).append(float(row["median_us"]))
    return {k: statistics.median(v) for k, v in t.items()}
base, head = rows("base"), rows("head")
print(f"{'case':<70} {'base us':>9} {'this us':>9} {'this/base':>9}")
for key in sorted(base.keys() & head.keys()):
    label = label_of(key)
    print(f"{label:<70} {base[key]:9.2f} {head[key]:9.2f} {head[key] / base[key]:9.3f}")
EOF
