#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call G: the fa3 prefill kernel compiles in a detached, niced process (from a copy of the
# bundle: later calls reuse it at the same paths) while fuzz throughput, the driver profile and the fuzz suite on
# the realloc seed run; then the call waits for the fa3 matrix rows (paged and ragged).
source benchmarks/device/lib.sh
mkdir -p /tmp/fcbg && cp -r .whl-0.7.2/site /tmp/fi072site
(PYTHONPATH=/tmp/fi072site:$PWD/src:$PWD setsid nohup nice -n 19 python3 benchmarks/target_matrix.py \
  --targets prefill-fa3,ragged-fa3 --steps 200 --checker all >/tmp/fcbg/matrix-fa3.log 2>&1 &)
step throughput.log python3 benchmarks/fuzz_throughput.py --target decode-tc --seconds 10 --layers cheap,all \
  --out "$W/fuzz_throughput-0.7.2.json"
step profile.log python3 benchmarks/profile_driver.py --target decode-tc --steps 250 --layers cheap,all --top 30
fz ReallocOnReplay tests.quality.seed_bugs_gpu:ReallocOnReplay 60s
until grep -q '^ragged-fa3 ' /tmp/fcbg/matrix-fa3.log 2>/dev/null || [ "$(left)" -le 15 ]; do sleep 5; done
cp /tmp/fcbg/matrix-fa3.log "$W/matrix-fa3.log"
pack
