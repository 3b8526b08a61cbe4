#!/usr/bin/env bash
# The +wW window read at the end of the last split (one launch) against main's region launches: an A/B
# of plain and windowed schemes, main's files laid over this tree for the base (2 interleaved rounds).
set -uo pipefail
R=$OUT
mkdir -p "$R/ab"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
s=$SECONDS
OUT=$R/ab KVQ_AB_BENCH=decode KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=${PAIRS:-Int4:Int4;Int8:Int8}" \
  KVQ_SCHEMES=${SCHEMES:-bf16,int4-g32-asym,int4-g32-asym+w128,int8-head,int8-head+w128,int4-head-asym,int4-head-asym+w128} \
  KVQ_SHAPES=${SHAPES:-'seed000/|llama8b/B(1|8)/T1024|smollm2/B(1|64)/T1024'} KVQ_AB_ROUNDS=${ROUNDS:-2} KVQ_AB_PACK=1 \
  KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
echo "ab rc=$? at $((SECONDS - s)) s"
cat "$R/ab/ab.txt"
tail -3 "$R/ab/device_ab.err"
cp "$R/ab/ab.txt" "$R/ab.txt"; mv "$R/ab/ab_runs.tgz" "$R/ab_runs.tgz"; gzip -c "$R/ab/device_ab.err" > "$R/device_ab.err.gz"; rm -rf "$R/ab"
