#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call AC: after the review's one change (a failed capture leaves no stale graph in its slot):
# the whole GPU suite again.
source benchmarks/device/lib.sh
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider
pack
