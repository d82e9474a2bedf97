"""penaltyserve: decode with penalties and FlashInfer sampling captured in the CUDA graph."""

__all__ = ["config", "engine"]
