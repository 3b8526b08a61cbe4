#!/usr/bin/env bash
# A/B on one GPU machine: builds a base tree and this one, then times the same decode cases with each,
# interleaved (base, this, base, this) so that clock and thermal drift fall on both alike, and prints
# this / base per row. Committed runs come from other machines; a slowdown of a few percent needs this.
#
#   git archive e7be665 | (mkdir -p .ab/base && tar -x -C .ab/base)     # where git is; .ab/ is ignored
#   OUT=... KVQ_SHAPES='llama8b/B1/' KVQ_SCHEMES=bf16,int8-head bash scripts/device_ab.sh .ab/base
#
# The CSVs' commit column: the device's copy of the tree carries a stale .git, so name the commits:
# KVQ_COMMIT for this tree, KVQ_BASE_COMMIT for the base (else "base-unknown", never this tree's).
#
# KVQ_SHAPES (a regex over labels such as seed000/B128/T8192), KVQ_SCHEMES (a comma list of storages, as
# `kvq bench --schemes`), KVQ_DECODE_VARIANTS (default ^decode-tc$) narrow the cases; KVQ_AB_ROUNDS
# (default 2) sets the interleaved rounds. KVQ_AB_BENCH=quantize times `kvq bench-quantize` instead
# (KVQ_SCHEMES its --schemes regex, KVQ_QUANTIZE_VARIANTS its --variant regex, KVQ_QUANTIZE_INPUT
# its --input: one or more, comma-separated, all timed by the same builds); KVQ_AB_BENCH=paged builds each tree's Python module and runs its
# experiments/bench/bench_paged.py with the arguments in KVQ_PAGED_ARGS (e.g. "--shapes smollm2
# --pairs int8-head --pages 16 64 --layout nhd"), printing both trees' paged times and paged /
# contiguous ratios. KVQ_AB_CMAKE adds cmake arguments to both trees' configure (e.g. "-DKVQ_TC_PAIRS=Int4:Int4"
# builds that pair's decode kernels alone: minutes less), KVQ_AB_CMAKE_BASE / KVQ_AB_CMAKE_HEAD to one tree's:
# the same sources with other tile knobs, e.g. KVQ_AB_CMAKE_HEAD='-DKVQ_TC_TUNING=KVQ_TC_STAGES=3' over a
# base that is this commit. Writes $OUT/ab_<side>_<round>.csv and $OUT/ab.txt (KVQ_AB_PACK=1: the CSVs,
# logs and build logs in $OUT/ab_runs.tgz).
#
# A base that is not a whole tree (no CMakeLists.txt) holds only the files that differ, at their paths
# in this tree (e.g. .ab/files/gpu/quantize_token.cu): this tree is built once, those files are laid
# over it and the same build directory rebuilt (a few translation units instead of a second tree),
# and this tree's files put back. Both sides then share one configuration: KVQ_AB_CMAKE only.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/device_ab.sh BASE_TREE_OR_FILES}
[[ -d $base ]] || { echo "device_ab: $base: no such directory" >&2; exit 2; }
overlay=0
[[ -f $base/CMakeLists.txt ]] || overlay=1
if ((overlay)) && [[ -n ${KVQ_AB_CMAKE_BASE:-}${KVQ_AB_CMAKE_HEAD:-} ]]; then
  echo "device_ab: $base holds files to lay over this tree (one build directory): KVQ_AB_CMAKE_BASE / _HEAD" \
       "need whole trees; KVQ_AB_CMAKE configures both sides" >&2
  exit 2
fi
OUT=${OUT:-results/ab}
mkdir -p "$OUT"
bench=${KVQ_AB_BENCH:-decode}
build() {  # build SRC DIR EXTRA_CMAKE_ARGS (the tuning knobs reset first: a reused build dir keeps its cache)
  local module=(-DKVQ_PYTHON_MODULE=OFF) targets=(kvq) extra
  read -r -a extra <<< "${KVQ_AB_CMAKE:-} $3"
  [[ $bench == paged ]] && module=(-DKVQ_PYTHON_MODULE=ON -DKVQ_PYTHON="${KVQ_PYTHON:-python3}") targets=(_core _gpu)
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
        "${module[@]}" -DKVQ_TC_TUNING= "${extra[@]}" > "$OUT/build_$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j "$(nproc)" --target "${targets[@]}" >> "$OUT/build_$(basename "$2").log" 2>&1
}
snapshot() {  # snapshot BUILD_DIR SIDE: what the runs use, kept apart from the next rebuild
  rm -rf "build-ab-$2" && mkdir -p "build-ab-$2/experiments"
  if [[ $bench == paged ]]; then cp -r "$1/python" "build-ab-$2/python"; else cp "$1/experiments/kvq" "build-ab-$2/experiments/kvq"; fi
}
if ((overlay)); then
  files=$(cd "$base" && find . -type f | sed 's|^\./||')
  for f in $files; do [[ -f $f ]] || { echo "device_ab: $base/$f: this tree has no $f" >&2; exit 2; }; done
  echo "device_ab: building this tree, then again with $(echo "$files" | wc -w) file(s) of $base laid over it" >&2
  start=$SECONDS
  build . build-ab-tree ""
  echo "device_ab: this tree built in $((SECONDS - start)) s" >&2
  snapshot build-ab-tree head
  saved=$(mktemp -d)
  restore() { (cd "$saved" && find . -type f | sed 's|^\./||') | while read -r f; do cp "$saved/$f" "$f"; done; }
  trap restore EXIT
  for f in $files; do mkdir -p "$saved/$(dirname "$f")" && cp "$f" "$saved/$f" && cp "$base/$f" "$f"; done
  start=$SECONDS
  KVQ_COMMIT="${KVQ_BASE_COMMIT:-base-unknown}" build . build-ab-tree ""
  echo "device_ab: the base rebuilt in $((SECONDS - start)) s" >&2
  restore
  trap - EXIT
  snapshot build-ab-tree base
else
  echo "device_ab: building the base ($base) and this tree" >&2
  start=$SECONDS
  KVQ_COMMIT="${KVQ_BASE_COMMIT:-base-unknown}" build "$base" build-ab-base "${KVQ_AB_CMAKE_BASE:-}" & pid=$!
  build . build-ab-head "${KVQ_AB_CMAKE_HEAD:-}"
  wait $pid
  echo "device_ab: both trees built in $((SECONDS - start)) s" >&2
fi
case $bench in
  decode) args=(bench --shapes "${KVQ_SHAPES:-llama8b/B1/}" --variant "${KVQ_DECODE_VARIANTS:-^decode-tc\$}")
          [[ -n ${KVQ_SCHEMES:-} ]] && args+=(--schemes "$KVQ_SCHEMES") ;;
  quantize) args=(bench-quantize --schemes "${KVQ_SCHEMES:-.}")  # --variant: not in whole-tree bases before it
            [[ -n ${KVQ_QUANTIZE_VARIANTS:-} ]] && args+=(--variant "$KVQ_QUANTIZE_VARIANTS")
            [[ -n ${KVQ_QUANTIZE_INPUT:-} ]] && args+=(--input "$KVQ_QUANTIZE_INPUT") ;;  # bases since 4924e2c
  paged) read -r -a args <<< "${KVQ_PAGED_ARGS:---shapes smollm2 --pairs int8-head}" ;;
  *) echo "device_ab: KVQ_AB_BENCH=$bench: expected decode, quantize or paged" >&2; exit 2 ;;
esac
for round in $(seq 1 "${KVQ_AB_ROUNDS:-2}"); do
  for side in base head; do
    echo "device_ab: round $round, $side" >&2
    csv=$OUT/ab_${side}_${round}.csv log=$OUT/ab_${side}_${round}.log
    if [[ $bench == paged ]]; then  # each tree's own script over its own module
      tree=$([[ $side == base && $overlay == 0 ]] && echo "$base" || echo .)
      PYTHONPATH="build-ab-$side/python" KVQ_COMMIT="$([[ $side == base ]] && echo "${KVQ_BASE_COMMIT:-base-unknown}" || echo "${KVQ_COMMIT:-unknown}")" \
        python3 "$tree/experiments/bench/bench_paged.py" --out "$csv" "${args[@]}" > "$log" 2>&1
    else
      "build-ab-$side/experiments/kvq" "${args[@]}" --csv "$csv" > "$log"
    fi
  done
done
python3 - "$OUT" "${KVQ_AB_ROUNDS:-2}" "$bench" << 'EOF' | tee "$OUT/ab.txt"
import csv, statistics, sys
sys.path.insert(0, "experiments/bench")
from compare_runs import label, row_key  # the regression check's rows: the same keys and names
out, rounds, bench = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PAGED_KEY = ("layout", "shape", "B", "T", "k", "v", "page_tokens")
def key_of(row):
    return tuple(row[f] for f in PAGED_KEY) if bench == "paged" else row_key(bench, row)
def label_of(key, row):
    if bench == "paged":
        return f"{row['layout']} {row['k']}/{row['v']} {row['shape']}/B{row['B']}/T{row['T']} P={row['page_tokens']}"
    return label(key, row)
examples = {}  # a row of each key, for its label
def rows(side, column):
    t = {}
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{out}/ab_{side}_{r}.csv")):
            t.setdefault(key_of(row), []).append(float(row[column]))
            examples.setdefault(key_of(row), row)
    return {k: statistics.median(v) for k, v in t.items()}
time = "paged_us" if bench == "paged" else "median_us"
base, head = rows("base", time), rows("head", time)
extra = bench == "paged"  # the paged / contiguous ratio each tree measured in its own runs
if extra:
    base_ratio, head_ratio = rows("base", "paged_over_contiguous"), rows("head", "paged_over_contiguous")
print(f"{'case':<70} {'base us':>9} {'this us':>9} {'this/base':>9}" + ("  P/C base  P/C this" if extra else ""))
for key in sorted(base.keys() & head.keys()):
    line = f"{label_of(key, examples[key]):<70} {base[key]:9.2f} {head[key]:9.2f} {head[key] / base[key]:9.3f}"
    if extra:
        line += f" {base_ratio[key]:9.3f} {head_ratio[key]:9.3f}"
    print(line)
EOF
# A lent GPU machine sends back few files (the device tool's README): KVQ_AB_PACK=1 leaves ab.txt and
# one archive of the rounds' CSVs and logs and the build logs.
if [[ ${KVQ_AB_PACK:-0} == 1 ]]; then
  (cd "$OUT" && tar -czf ab_runs.tgz ab_*_*.csv ab_*_*.log build_*.log && rm -f ab_*_*.csv ab_*_*.log build_*.log)
fi
