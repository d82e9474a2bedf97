#!/usr/bin/env bash
# Either FlashInfer version (0.6.13: call M, after L; 0.7.2: call N, after K): `pytest -m fuzz` on every clean target
# (must pass) and every seed-bug target (must fail with a reproducer), one process per target, side by side.
source benchmarks/device/lib.sh
for t in decode-cuda decode-tc prefill-fa2 prefill-fa3 ragged-fa2 ragged-fa3 mla-fa2 mla-fa3 batch-attention; do
  fz "$t" "$t" 30s &
done
for c in $SEED_CLASSES; do fz "$c" "tests.quality.seed_bugs_gpu:$c" 60s & done
wait
pack
