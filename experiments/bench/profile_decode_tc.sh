#!/usr/bin/env bash
# ncu profile of decode-tc kernels, one (storage, shape) case each: the usual sections (speed of
# light, warp states, issue, occupancy) and the SASS of each kernel with executed instructions per
# line, to see where a kernel's issue slots go. Needs a built kvq (scripts/device_run.sh builds one).
#
#   OUT=results/ncu KVQ_PROFILE_CASES="int4-head-asym@seed000/B128/ bf16@seed000/B128/" \
#     bash experiments/bench/profile_decode_tc.sh
# A case is STORAGE@SHAPE_REGEX (kvq bench's --schemes and --shapes); KVQ_VARIANT picks the variant.
# KVQ_NCU_WARM=1 profiles as the bench runs: a launch after warm-up (--launch-skip), caches not
# flushed and clocks not locked (ncu's defaults run a short kernel from a cold instruction cache and
# L2, which overstates fetch stalls). KVQ_NCU_KERNELS (regex) and KVQ_NCU_COUNT pick the kernels.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/ncu}
kvq=${KVQ_BIN:-build-gpu/experiments/kvq}
mkdir -p "$OUT"
cases=${KVQ_PROFILE_CASES:-int4-head-asym@seed000/B128/}
for c in $cases; do
  storage=${c%@*} shape=${c#*@}
  name=$(echo "$storage-$shape" | tr -c 'A-Za-z0-9_\n' '-')
  warm=()
  [[ ${KVQ_NCU_WARM:-0} == 1 ]] && warm=(--launch-skip 40 --cache-control none --clock-control none --warp-sampling-interval 0)
  ncu -k "regex:${KVQ_NCU_KERNELS:-decode_tc_kernel}" -c "${KVQ_NCU_COUNT:-1}" "${warm[@]}" -f -o "/tmp/kvq-$name" --import-source yes \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters --section SchedulerStats \
    --section InstructionStats \
    "$kvq" bench --shapes "$shape" --schemes "$storage" --variant "${KVQ_VARIANT:-^decode-tc$}" --reps 30 \
    --csv /tmp/kvq-ncu.csv > "$OUT/bench-$name.log" 2>&1
  ncu -i "/tmp/kvq-$name.ncu-rep" --print-details all > "$OUT/ncu-$name.txt"
  ncu -i "/tmp/kvq-$name.ncu-rep" --page source --csv --print-source sass > "$OUT/sass-$name.csv"
  echo "== $c"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Registers Per Thread|Achieved Occupancy|No Eligible|Warp Cycles Per Issued" \
    "$OUT/ncu-$name.txt" | head -n 12
done
# Few files come back from a lent GPU machine: one archive of the reports.
tar -czf "$OUT/ncu.tar.gz" -C "$OUT" --remove-files $(cd "$OUT" && ls ncu-*.txt sass-*.csv bench-*.log)
