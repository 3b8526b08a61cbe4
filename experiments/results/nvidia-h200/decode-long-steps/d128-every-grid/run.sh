#!/usr/bin/env bash
# A/B: 16-bit K/V at D = 128 in 32-key steps, 2 stages (this tree) vs main's traits; then the gate on this tree.
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
OUT=$R/ab KVQ_AB_BENCH=decode KVQ_AB_CMAKE='-DKVQ_TC_PAIRS=Bf16:Bf16;Fp16:Fp16;Bf16:Fp16;Fp16:Bf16;Int4:Int4;Int8:Int8' \
  KVQ_SCHEMES=bf16,int4-g32-asym+w128,int8-head+w128 KVQ_SHAPES=. KVQ_AB_ROUNDS=2 KVQ_AB_PACK=1 \
  KVQ_COMMIT=wide16 KVQ_BASE_COMMIT=0b17552 bash scripts/device_ab.sh .ab/files 2>&1 | tail -75
build-ab-head/experiments/kvq validate --variant '^decode-tc$' --report $R/validate.json > $R/validate.log 2>&1
echo "validate rc=$?"; tail -n 6 $R/validate.log
gzip -f $R/validate.json $R/validate.log
ls $R $R/ab
