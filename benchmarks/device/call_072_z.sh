#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call Z (final code of the third session): fuzz throughput first, alone on a quiet GPU,
# then the seed bugs, the GPU suite, the 200-step matrix and `pytest -m fuzz` on every target (refresh_all.sh).
source benchmarks/device/lib.sh
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap \
  --out "$W/fuzz_throughput-0.7.2.json"
source benchmarks/device/refresh_all.sh
