#!/usr/bin/env bash
# Next step for this folder's four slower rows: acec94d (the baseline's tree) against this tree on one
# machine, interleaved (scripts/device_ab.sh), at the latency-bound rows and their bf16 controls.
# Where git is:
#   rm -rf .ab/base && mkdir -p .ab/base && git archive acec94d | tar -x -C .ab/base
# then on the device (carry [".ab"]; two whole-tree builds of three pairs run side by side):
#   OUT=$OUT bash experiments/results/nvidia-h200/decode-host-split/bisect_ab.sh
# A row slower here than at acec94d is a commit's; bisect over `git log acec94d..HEAD -- gpu/decode_tc*`.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
KVQ_BASE_COMMIT=acec94d KVQ_AB_ROUNDS=${KVQ_AB_ROUNDS:-3} \
  KVQ_SHAPES='smollm2/B(1|8)/T1024|llama8b/B1/T1024' KVQ_SCHEMES=bf16,int8-head,int4-head-asym \
  KVQ_AB_CMAKE='-DKVQ_TC_PAIRS=Int8:Int8;Int4:Int4;Bf16:Bf16' bash scripts/device_ab.sh .ab/base
