"""Constants shared by the FP4 KV cache, the calibration and the attention backend."""

FP4_BLOCK = 16  # elements per FP8 block scale (NVFP4 layout)
E2M1_MAX = 6.0
FP8_E4M3_MAX = 448.0

# Float workspace of the eager dequant-decode path. Sized once for the benchmark batch (bs=48, 8k context).
DEQUANT_WORKSPACE_BYTES = 96 * 1024 * 1024

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32)
