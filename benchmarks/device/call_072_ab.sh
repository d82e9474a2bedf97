#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call AB: fuzz throughput again on the final code (a second sample beside call Y's), with
# the `all` layers (CUPTI, dispatch in hot regions) too, alone on the GPU.
source benchmarks/device/lib.sh
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-ab-0.7.2.json"
pack
