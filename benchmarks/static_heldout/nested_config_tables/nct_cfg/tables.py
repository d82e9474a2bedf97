"""Lookup tables that turn configuration values into wrapper keyword arguments."""

# KV-cache dtype -> decode backend.  FP8 KV pages are only served by the trtllm-gen kernels.
DECODE_BACKEND_BY_KV_DTYPE = {"fp8_e4m3": "trtllm-gen", "bfloat16": "fa2", "float16": "fa2"}

# Keys of cfg["decode"] that BatchDecodeWithPagedKVCacheWrapper.__init__ accepts.
DECODE_WRAPPER_KEYS = ("use_tensor_cores",)

# Keys of cfg["prefill"] that BatchPrefillWithPagedKVCacheWrapper.plan accepts.
PREFILL_PLAN_KEYS = ("causal", "pos_encoding_mode", "logits_soft_cap")

# Wrapper state the graph runner snapshots after each capture for its debug dump.
PLAN_STATE_FIELDS = ("_plan_info", "_fixed_batch_size")

TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "fp8_e4m3": "float8_e4m3fn"}


def pick(section, keys):
    """The items of a config section that a callee accepts."""
    return {k: v for k, v in section.items() if k in keys}
