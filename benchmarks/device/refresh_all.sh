#!/usr/bin/env bash
# Either FlashInfer version (calls R, S; fourth session: AA for 0.6.13, Z for 0.7.2 via call_072_z.sh), after a change
# to the driver, the targets or the reference:
# the seed bugs, the whole GPU test suite and the 200-step matrix of every target side by side, then `pytest -m fuzz`
# on every clean and seed-bug target (fuzz_suite_all.sh).
source benchmarks/device/lib.sh
v=$(python3 -c 'import flashinfer; print(flashinfer.__version__)' 2>/dev/null)
step seed.log python3 benchmarks/seed_bugs.py --budget 200 --out "$W/seed_bugs-$v.json" &
FLASHCHECK_GPU_STEPS=40 step pytest-gpu.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu -q -rs \
  -p no:cacheprovider &
step matrix.log python3 benchmarks/target_matrix.py --steps 200 --checker all --out "$W/matrix-$v.json" &
wait
source benchmarks/device/fuzz_suite_all.sh
