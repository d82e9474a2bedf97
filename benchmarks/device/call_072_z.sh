#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call Z (final code of the fourth session; call Y, speed_check.sh, measured its throughput):
# the seed bugs, the GPU suite, the 200-step matrix and `pytest -m fuzz` on every target (refresh_all.sh).
source benchmarks/device/refresh_all.sh
