#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call V (third session, first): where a step's time goes now, before the next speed work:
# the driver under cProfile and torch.profiler, then the Hypothesis state machine under cProfile.
source benchmarks/device/lib.sh
step profile-driver.log python3 benchmarks/profile_driver.py --target decode-tc --steps 300 --layers cheap --top 45 \
  --kernels
step profile-sm.log python3 benchmarks/profile_driver.py --target decode-tc --mode state-machine --seconds 10 \
  --layers cheap --top 60
pack
