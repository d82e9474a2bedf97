#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call H (right after G, same machine): wait for the fa3 matrix rows, then the fa3 GPU tests
# and fuzz suite from the same bundle copy (same paths: the compiled kernel is loaded, not rebuilt).
source benchmarks/device/lib.sh
export PYTHONPATH=/tmp/fi072site:$PWD/src:$PWD
until grep -q '^ragged-fa3 ' /tmp/fcbg/matrix-fa3.log 2>/dev/null || [ "$(left)" -le 150 ]; do sleep 5; done
cp /tmp/fcbg/matrix-fa3.log "$W/matrix-fa3.log"
FLASHCHECK_GPU_STEPS=40 step pytest-fa3.log python3 -m pytest -p flashcheck.pytest_plugin \
  tests/gpu/test_targets_gpu.py -q -rs -k fa3 &
for t in prefill-fa3 ragged-fa3; do fz "$t" "$t" 30s & done
wait
pack
