#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call I. The fa3 prefill kernel (batch_prefill_..._sm90) never built on the device: the
# bundle's trimmed wheel lacks cutlass/tools/util/include (reports/gpu-evidence.md §1). It was built off the device
# with the same nvcc 13.0 and travels prebuilt in .whl-0.7.2/aot (the missing headers ride along for other JIT
# builds). First fuzz throughput and the driver profile on a quiet GPU, then the fa3 matrix rows beside the whole
# GPU test suite, then the fuzz suite of both fa3 targets.
source benchmarks/device/lib.sh
nvd=$(dirname "$(readlink -f "$(command -v nvcc)")")/..
{ nvcc --version | tail -2; ls "$nvd"/include/curand_kernel.h; } >"$W/toolkit.txt" 2>&1
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-0.7.2.json"
step profile.log python3 benchmarks/profile_driver.py --target decode-tc --steps 200 --layers cheap --top 30 --kernels
step matrix-fa3.log python3 benchmarks/target_matrix.py --targets prefill-fa3,ragged-fa3 --steps 200 --checker all \
  --out "$W/matrix-fa3-0.7.2.json" &
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider &
wait
for t in prefill-fa3 ragged-fa3; do fz "$t" "$t" 30s; done
pack
