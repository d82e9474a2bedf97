#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, calls W, X and Y (fourth session), one after each step of the speed work: the whole GPU
# suite (correctness first), fuzz throughput (baseline first and last), the driver's profile and, unless
# SM_PROFILE=0 (call Y), the state machine's.
#   W: graphs captured without torch.cuda.graph's flushes (one pool per bucket), replay bursts and fixed capture
#      strategies in the state machine, lazy stack source lines, fp16/bf16 reference with fp32 accumulation
#   X: + the driver's reference padded to power-of-two shapes and replayed as CUDA graphs
#   Y: + pages gathered head-major, arena and reference graphs captured without flushes (final code)
source benchmarks/device/lib.sh
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap \
  --out "$W/fuzz_throughput-0.7.2.json"
step profile-driver.log python3 benchmarks/profile_driver.py --target decode-tc --steps 300 --layers cheap --top 45 \
  --kernels
if [ "${SM_PROFILE:-1}" != 0 ]; then
  step profile-sm.log python3 benchmarks/profile_driver.py --target decode-tc --mode state-machine --seconds 10 \
    --layers cheap --top 60
fi
pack
