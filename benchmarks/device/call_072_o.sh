#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call O: fuzz throughput again with the baseline run first and last (call J's baseline,
# 71.8 steps/s, was slower than calls G and I measured it: 90-91), then the runtime GPU tests after the fix of the
# profiler-warning filter (the warning must not appear in the summary).
source benchmarks/device/lib.sh
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-0.7.2.json"
step pytest-runtime.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu/test_runtime_gpu.py -q -rs \
  -p no:cacheprovider
pack
