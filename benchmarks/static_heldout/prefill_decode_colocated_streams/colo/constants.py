PAGE_SIZE = 16
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64)
# Sized once for the 64-row decode bucket on the launch model.
DECODE_WS_BYTES = 192 << 20
