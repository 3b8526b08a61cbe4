#!/usr/bin/env bash
# paged 8-bit pairs: base vs overlay variants ($VARS), bench_paged NHD shuffled, interleaved rounds (H200)
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
echo "commit ${KVQ_COMMIT:-unknown}" >> $OUT/gpu.txt
start=$SECONDS
root=$PWD
b() { # srcdir name flags
  cd $1 && cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVQ_PYTHON=python3 \
   "-DKVQ_TC_PAIRS=${PAIRS_BUILD:-Int8:Int8;Fp8E4m3:Fp8E4m3}" "-DCMAKE_CUDA_FLAGS=$3" > /tmp/build_$2.log 2>&1 &&
   cmake --build build-gpu -j ${JOBS:-6} --target _gpu _core ${TARGETS:-} >> /tmp/build_$2.log 2>&1 || { echo "BUILD FAIL $2"; grep -m5 -i error /tmp/build_$2.log; }
}
(b $root base "") &
for v in $VARS; do
  rm -rf /tmp/$v && mkdir -p /tmp/$v && tar --exclude=./build-gpu --exclude=./.ab -cf - . | tar -xf - -C /tmp/$v && cp -r .ab/variants/$v/gpu /tmp/$v/
  (b /tmp/$v $v "$(cat .ab/variants/$v/cuda_flags 2>/dev/null)") &
done
wait
cd $root
echo "builds $((SECONDS-start)) s"
run() { # name tree extra-args
  PYTHONPATH=$2/build-gpu/python timeout 150 python3 experiments/bench/bench_paged.py --out $OUT/$1.csv --pages ${PAGES:-16} \
    --pairs "${PAIRS_RE:-int8-head|fp8}" --shapes "${SHAPES_RE:-.}" ${@:3} 2> /dev/null | sed "s/^/$1: /"
}
for r in $(seq ${ROUNDS:-2}); do
  run base_$r $root
  for v in $VARS; do run ${v}_$r /tmp/$v; done
done
echo "total $((SECONDS-start)) s"
