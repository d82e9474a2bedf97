#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call Q (last): the torch reference computes every batch in one shot (multi-query batches
# too: speculative decode, prefill chunks), no longer request by request. Fuzz throughput with the baseline first and
# last on a quiet GPU; then the 200-step matrix of every target beside the whole GPU test suite.
source benchmarks/device/lib.sh
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-0.7.2.json"
step matrix.log python3 benchmarks/target_matrix.py --steps 200 --checker all --out "$W/matrix-0.7.2.json" &
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider &
wait
pack
