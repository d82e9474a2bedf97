#!/usr/bin/env bash
# FlashInfer 0.7.2.post1, call C: the fa3 prefill kernel compiled alone (the busy calls A and B could not finish it),
# then its matrix rows (paged and ragged).
source benchmarks/device/lib.sh
step matrix-fa3-c.log python3 benchmarks/target_matrix.py --targets prefill-fa3,ragged-fa3 --steps 200 --checker all
pack
