#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call A: driver profile on a quiet GPU, then in parallel the target matrix (first-time JIT
# of fa3, MLA, BatchAttention), the seed bugs and the runtime/seed GPU tests.
source benchmarks/device/lib.sh
step profile.log python3 benchmarks/profile_driver.py --target decode-tc --steps 250 --layers cheap,all --top 45
m() { step "matrix-$1.log" python3 benchmarks/target_matrix.py --targets "$1" --steps 200 --checker all; }
(m prefill-fa3; m ragged-fa3) &
m ragged-fa2 &
m mla-fa2 &
m mla-fa3 &
m batch-attention &
m decode-cuda,decode-tc,prefill-fa2 &
(step seed.log python3 benchmarks/seed_bugs.py --budget 200 --out "$W/seed_bugs-0.7.2.json"
 step pytest-runtime.log python3 -m pytest -p flashcheck.pytest_plugin tests/gpu/test_runtime_gpu.py \
   tests/gpu/test_seed_bugs_gpu.py -q -rs) &
wait
pack
