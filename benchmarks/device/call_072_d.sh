#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call D: fuzz throughput and the driver profile on a quiet GPU; then the fa3 prefill kernel
# compiles in a detached process (from a copy of the bundle, so later calls may swap bundles) while the runtime and
# seed GPU tests, the fuzz suite on the remaining targets and the decode matrix rows run.
source benchmarks/device/lib.sh
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-0.7.2.json"
step profile.log python3 benchmarks/profile_driver.py --target decode-tc --steps 250 --layers cheap,all --top 30
mkdir -p /tmp/fcbg && cp -r .whl-0.7.2/site /tmp/fi072site
(cd "$PWD" && PYTHONPATH=/tmp/fi072site:$PWD/src:$PWD setsid nohup python3 benchmarks/target_matrix.py \
  --targets prefill-fa3,ragged-fa3 --steps 200 --checker all >/tmp/fcbg/matrix-fa3.log 2>&1 &)
step pytest-runtime.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu/test_runtime_gpu.py \
  tests/gpu/test_seed_bugs_gpu.py -q -rs &
step matrix-decode.log python3 benchmarks/target_matrix.py --targets decode-cuda,decode-tc --steps 200 --checker all &
for t in prefill-fa2 ragged-fa2 mla-fa2 mla-fa3 batch-attention; do fz "$t" "$t" 30s & done
fz ReallocOnReplay tests.quality.seed_bugs_gpu:ReallocOnReplay 60s &
wait
cp /tmp/fcbg/matrix-fa3.log "$W/bg-matrix-fa3-so-far.log"
pack
