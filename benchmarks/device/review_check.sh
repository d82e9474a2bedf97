#!/usr/bin/env bash
# Either FlashInfer version (calls T: 0.6.13, U: 0.7.2.post1), after the review: decode and paged prefill share one
# builder of their paged-CSR plan() arguments, and a failed replay screen reuses its reference. The whole GPU test
# suite beside the 200-step matrix rows of the targets whose plan() changed.
source benchmarks/device/lib.sh
v=$(python3 -c 'import flashinfer; print(flashinfer.__version__)' 2>/dev/null)
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider &
step matrix.log python3 benchmarks/target_matrix.py --steps 200 --checker all --out "$W/matrix-review-$v.json" \
  --targets decode-cuda,decode-tc,prefill-fa2,prefill-fa3 &
wait
pack
