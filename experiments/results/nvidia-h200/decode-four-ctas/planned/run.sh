#!/usr/bin/env bash
# A/B of the four-CTA int4 kernel (planned) against 39d0e0d, int4 and bf16 pairs built; then the gate and
# memcheck on this tree's build; then ncu of int4-head at seed000 B = 512 and llama8b B = 64 T = 1K on both.
set -uo pipefail
R=$OUT
mkdir -p "$R/ab" "$R/gate"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt"
OUT=$R/ab KVQ_AB_CMAKE='-DKVQ_TC_PAIRS=Int4:Int4;Bf16:Bf16' \
  KVQ_SCHEMES=int4-head-asym,int4-head-asym:fbgemm,int4-g32-asym,bf16 KVQ_SHAPES='seed000|llama8b/B(1|8|64)/' \
  KVQ_AB_ROUNDS=2 KVQ_AB_PACK=1 KVQ_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo f2fddf5) KVQ_BASE_COMMIT=39d0e0d \
  bash scripts/device_ab.sh .ab/base 2> "$R/ab/device_ab.err"
echo "ab rc=$?"
cat "$R/ab/ab.txt"
kvq=build-ab-head/experiments/kvq
$kvq validate --variant '^decode-tc$' > "$R/gate/validate.txt" 2>&1; echo "gate rc=$?"
echo "gate OK: $(grep -c '\[OK\]' "$R/gate/validate.txt")  failed (not left out): $(grep -i 'fail' "$R/gate/validate.txt" | grep -vc 'left out of this build')"
grep -i 'fail' "$R/gate/validate.txt" | grep -v 'left out of this build' | head -5
grep -i "four-CTA\|int4-head" "$R/gate/validate.txt" | head -5
timeout 200 compute-sanitizer --tool memcheck --print-limit 20 $kvq validate --quick --variant '^decode-tc$' > "$R/gate/memcheck.txt" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|errors" "$R/gate/memcheck.txt" | tail -2
for side in base head; do
  OUT=$R/ncu/$side KVQ_BIN=build-ab-$side/experiments/kvq KVQ_NCU_WARM=1 \
    KVQ_PROFILE_CASES="int4-head-asym@seed000/B512/ int4-head-asym@llama8b/B64/T1024" \
    timeout 150 bash experiments/bench/profile_decode_tc.sh 2>&1 | grep -v "^==PROF==" | tail -30; echo "ncu $side done"
done
tar -czf "$R/gate_ncu.tgz" -C "$R" gate ncu && rm -rf "$R/gate" "$R/ncu"
