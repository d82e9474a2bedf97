#!/usr/bin/env bash
# FlashInfer 0.6.13, call E: seed bugs, the whole GPU test suite, the fuzz suite on every clean target (must pass)
# and every seed-bug target (must fail with a reproducer), the decode matrix rows; in parallel.
source benchmarks/device/lib.sh
step seed.log python3 benchmarks/seed_bugs.py --budget 200 --out "$W/seed_bugs-0.6.13.json" &
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs &
step matrix-decode.log python3 benchmarks/target_matrix.py --targets decode-cuda,decode-tc --steps 200 --checker all &
for t in decode-cuda decode-tc prefill-fa2 prefill-fa3 ragged-fa2 ragged-fa3 mla-fa2 mla-fa3 batch-attention; do
  fz "$t" "$t" 30s &
done
for c in $SEED_CLASSES; do fz "$c" "tests.quality.seed_bugs_gpu:$c" 60s & done
wait
pack
