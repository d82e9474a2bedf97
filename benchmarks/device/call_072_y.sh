#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call Y: + the reference gathers pages head-major (no transposing copy of K and V), graphs
# (targets, arena, reference) captured without torch.cuda.graph's device sync and cache flushes; throughput records
# steps/s per 250-step window. GPU suite, throughput, driver profile.
source benchmarks/device/lib.sh
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap \
  --out "$W/fuzz_throughput-0.7.2.json"
step profile-driver.log python3 benchmarks/profile_driver.py --target decode-tc --steps 300 --layers cheap --top 45 \
  --kernels
pack
