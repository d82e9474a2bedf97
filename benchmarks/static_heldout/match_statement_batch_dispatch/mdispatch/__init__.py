from .batches import DecodeBatch, PrefillBatch, build_decode_batch, build_prefill_batch
from .config import (DECODE_BUCKETS, PAGE_SIZE, PREFILL_WORKSPACE_BYTES, REQUEST_KINDS, EngineConfig,
                     shared_float_workspace, window_workspace_bytes)

__all__ = ["DECODE_BUCKETS", "PAGE_SIZE", "PREFILL_WORKSPACE_BYTES", "REQUEST_KINDS", "DecodeBatch", "EngineConfig",
           "PrefillBatch", "build_decode_batch", "build_prefill_batch", "shared_float_workspace",
           "window_workspace_bytes"]
