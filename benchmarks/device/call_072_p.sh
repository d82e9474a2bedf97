#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call P: the decode reference's einsums became two batched matmuls over fp32 copies made in
# the matmuls' layouts. Fuzz throughput with the baseline first and last on a quiet GPU, then the whole GPU test
# suite and the matrix rows whose steps use the decode reference (decode, MLA), after that change.
source benchmarks/device/lib.sh
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-0.7.2.json"
step matrix.log python3 benchmarks/target_matrix.py --steps 200 --checker all --out "$W/matrix-0.7.2-p.json" \
  --targets decode-cuda,decode-tc,mla-fa2,mla-fa3 &
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider &
wait
pack
