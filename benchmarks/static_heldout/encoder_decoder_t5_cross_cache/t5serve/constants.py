NUM_BUCKETS = 32
MAX_DISTANCE = 128
# ragged encoder prefill workspace (sized for 8 prompts of 512 tokens)
ENCODER_WS_BYTES = 192 * 1024 * 1024
FP16_CLAMP_MARGIN = 1000.0
