#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call B: fa3 prefill compile + matrix rows; the clean-target GPU tests; the fuzz suite on
# clean targets (must pass) and on every seed-bug target (must fail with a reproducer), in parallel processes.
source benchmarks/device/lib.sh
(step matrix-fa3.log python3 benchmarks/target_matrix.py --targets prefill-fa3,ragged-fa3 --steps 200 --checker all) &
FLASHCHECK_GPU_STEPS=40 step pytest-targets.log python3 -m pytest -p flashcheck.pytest_plugin \
  tests/gpu/test_targets_gpu.py -q -rs -k "not fa3" &
fz() { step "fuzz-$2.log" python3 -m pytest -p flashcheck.pytest_plugin -m fuzz --pyargs flashcheck.fuzz.suite \
  --flashcheck-target "$1" --flashcheck-budget "$3" --flashcheck-out "$W/fuzz-$2" -q -rs -p no:cacheprovider; }
for t in ${FUZZ_CLEAN:-decode-cuda decode-tc ragged-fa2 batch-attention}; do fz "$t" "$t" 30s & done
for c in TolistInPrepareReplay DeviceIndptrToPlan IndptrPollutedInGraph UndersizedPrefillWorkspace ReallocOnReplay \
  SplitKVOversubscribed; do fz "tests.quality.seed_bugs_gpu:$c" "$c" 60s & done
wait
for d in "$W"/fuzz-*/; do [ -d "$d" ] && (cd "$d" && find . -type f | head -20 >"$W/$(basename "$d").files"); done
pack
