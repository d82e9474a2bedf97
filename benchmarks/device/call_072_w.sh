#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call W: after graphs captured without torch.cuda.graph's flushes (one pool per bucket),
# replay bursts and fixed capture strategies in the state machine, lazy source lines in stacks, and the
# fp16/bf16 reference with fp32 accumulation. GPU suite first (correctness), then throughput, then profiles.
source benchmarks/device/lib.sh
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap \
  --out "$W/fuzz_throughput-0.7.2.json"
step profile-driver.log python3 benchmarks/profile_driver.py --target decode-tc --steps 300 --layers cheap --top 45 \
  --kernels
step profile-sm.log python3 benchmarks/profile_driver.py --target decode-tc --mode state-machine --seconds 10 \
  --layers cheap --top 60
pack
