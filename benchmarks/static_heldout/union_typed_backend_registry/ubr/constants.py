"""Engine-wide constants. The package re-exports them."""

PAGE_SIZE = 16
HEAD_DIM = 128
# The trtllm-gen decode path was tuned on a single benchmark shape.
TRTLLM_WS_BYTES = 256 * 1024 * 1024
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
