#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call J: after the per-step cost work (arena arm/scan recorded as CUDA graphs, the replay
# screened against the reference on the device, whole-page gathers and pinned index copies in the reference):
# the GPU runtime tests (they compare the graphed arena with the eager one), fuzz throughput side by side with the
# plain @given loop on a quiet GPU, the driver profile with device time, and the 200-step matrix rows of the
# decode and prefill targets (call K: MLA, BatchAttention and the seed bugs).
source benchmarks/device/lib.sh
step pytest-runtime.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu/test_runtime_gpu.py -q -rs \
  -p no:cacheprovider
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-0.7.2.json"
step profile.log python3 benchmarks/profile_driver.py --target decode-tc --steps 200 --layers cheap --top 30 --kernels
step matrix.log python3 benchmarks/target_matrix.py --steps 200 --checker all --out "$W/matrix-0.7.2-j.json" \
  --targets decode-cuda,decode-tc,prefill-fa2,prefill-fa3,ragged-fa2,ragged-fa3
pack
