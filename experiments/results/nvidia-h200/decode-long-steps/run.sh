#!/usr/bin/env bash
# A/B: 16-bit K/V long steps where a split's CTAs fit on the SMs (this tree) vs main; the gate on this
# tree (the pairs built); cuDNN beside this tree's bf16 at every bench shape.
set -uo pipefail
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
OUT=$R/ab KVQ_AB_BENCH=decode KVQ_AB_CMAKE='-DKVQ_TC_PAIRS=Bf16:Bf16;Fp16:Fp16;Bf16:Fp16;Fp16:Bf16;Int4:Int4;Int8:Int8' \
  KVQ_SCHEMES=bf16 KVQ_SHAPES=. KVQ_AB_ROUNDS=2 KVQ_AB_PACK=1 \
  KVQ_COMMIT=long-steps KVQ_BASE_COMMIT=0b17552 bash scripts/device_ab.sh .ab/files 2>&1 | tail -25
build-ab-head/experiments/kvq validate --variant '^decode-tc$' --report $R/validate.json > $R/validate.log 2>&1
echo "validate rc=$?"; grep -v "no kernels for" $R/validate.log | grep -c "^\[OK\]"; grep "^\[FAIL\]" $R/validate.log | grep -vc "no kernels for"; tail -n 1 $R/validate.log
(cd experiments/bench && python3 bench_peers.py --out $R/peers.csv --peers '^cudnn$' > $R/peers.log 2>&1)
build-ab-head/experiments/kvq bench --variant '^decode-tc$' --schemes bf16,fp16 --peers $R/peers.csv --csv $R/decode.csv > $R/bench.log 2>&1
grep decode-tc $R/bench.log | awk '{print $1,$2,$5,$7,$8,$9,$10,$15}'
gzip -f $R/validate.json $R/validate.log $R/peers.log $R/bench.log
ls $R $R/ab
