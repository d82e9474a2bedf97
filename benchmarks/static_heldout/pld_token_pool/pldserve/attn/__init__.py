from pldserve.attn.fi_state import DECODE_BUCKETS, PLDFlashInferState

__all__ = ["DECODE_BUCKETS", "PLDFlashInferState"]
