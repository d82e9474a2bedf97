#!/usr/bin/env bash
# FlashInfer 0.7.2.post1: build the fa3 prefill kernel (batch_prefill_..._sm90), which failed on the H100 with 10
# parallel sm90 compiles (reports/gpu-evidence.md §1). Start it at the beginning of a device session and keep the
# following calls back to back (a machine idle for 30 s is given back, and the build with it). The build runs
# detached, with fewer parallel jobs, from a copy of the bundle at a fixed path, so later calls load the kernel
# instead of rebuilding it. Then run call_072_h.sh (matrix rows, GPU tests and fuzz suite for prefill-fa3/ragged-fa3).
source benchmarks/device/lib.sh
mkdir -p /tmp/fcbg && [ -d /tmp/fi072site ] || cp -r .whl-0.7.2/site /tmp/fi072site
(MAX_JOBS=${MAX_JOBS:-3} PYTHONPATH=/tmp/fi072site:$PWD/src:$PWD setsid nohup python3 benchmarks/target_matrix.py \
  --targets prefill-fa3,ragged-fa3 --steps 200 --checker all >/tmp/fcbg/matrix-fa3.log 2>&1 &)
until grep -q '^ragged-fa3 ' /tmp/fcbg/matrix-fa3.log 2>/dev/null || [ "$(left)" -le 15 ]; do sleep 10; done
cp /tmp/fcbg/matrix-fa3.log "$W/matrix-fa3.log"
free -g >"$W/free.txt"
pack
