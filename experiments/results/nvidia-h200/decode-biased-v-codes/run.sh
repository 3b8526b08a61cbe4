#!/usr/bin/env bash
# Biased int8 / int4 codes (no subtraction a pair) against the base decode-tc headers in .ab/files:
# A/B over int4 and int8 pairs, then the gate and memcheck on this tree, then ncu of int4-head-asym.
set -uo pipefail
R=$OUT; mkdir -p "$R/ab" "$R/gate"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
rm -rf build-ab-*
s=$SECONDS
OUT=$R/ab KVQ_AB_BENCH=decode KVQ_AB_CMAKE="-DKVQ_TC_PAIRS=${PAIRS:-Int4:Int4;Int8:Int8}" \
  KVQ_SCHEMES=${SCHEMES:-int4-head-asym,int4-g32-asym,int8-head,int4-head-asym:fbgemm} \
  KVQ_SHAPES=${SHAPES:-'seed000/B(32|128|512)/|llama8b/B(1|8)/T1024|smollm2/B(1|64)/'} KVQ_AB_ROUNDS=${ROUNDS:-2} KVQ_AB_PACK=1 \
  KVQ_COMMIT=${HEAD_COMMIT:-unknown} KVQ_BASE_COMMIT=${BASE_COMMIT:-unknown} bash scripts/device_ab.sh .ab/files 2> "$R/ab/device_ab.err"
echo "ab rc=$? at $((SECONDS - s)) s"
cat "$R/ab/ab.txt"; tail -3 "$R/ab/device_ab.err"
kvq=build-ab-head/experiments/kvq
if [[ ${GATE:-1} == 1 ]]; then
  timeout 200 $kvq validate --variant '^decode-tc$' > "$R/gate/validate.txt" 2>&1; echo "gate rc=$? at $((SECONDS - s)) s"
  echo "gate OK: $(grep -c '\[OK\]' "$R/gate/validate.txt")  failed (not left out): $(grep -i 'fail' "$R/gate/validate.txt" | grep -vc 'left out of this build')"
  grep -i 'fail' "$R/gate/validate.txt" | grep -v 'left out of this build' | head -8
fi
if [[ ${MEMCHECK:-0} == 1 ]]; then
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 $kvq validate --quick --variant '^decode-tc$' > "$R/gate/memcheck.txt" 2>&1
  echo "memcheck rc=$? at $((SECONDS - s)) s"; grep -E "ERROR SUMMARY" "$R/gate/memcheck.txt" | tail -1
fi
if [[ ${NCU:-0} == 1 ]]; then
  for side in base head; do
    OUT=$R/ncu/$side KVQ_BIN=build-ab-$side/experiments/kvq KVQ_NCU_WARM=1 \
      KVQ_PROFILE_CASES="${NCU_CASES:-int4-head-asym@seed000/B128/}" \
      timeout 100 bash experiments/bench/profile_decode_tc.sh 2>&1 | grep -v "^==PROF==" | tail -12; echo "ncu $side done at $((SECONDS - s)) s"
  done
fi
tar -czf "$R/gate_ncu.tgz" -C "$R" gate $( [[ -d $R/ncu ]] && echo ncu ) && rm -rf "$R/gate" "$R/ncu"
