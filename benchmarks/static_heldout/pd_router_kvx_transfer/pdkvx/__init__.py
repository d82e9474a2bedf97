"""Prefill/decode disaggregated serving: a router, prefill workers and a decode pool that receives
KV pages asynchronously through transfer handles."""
from pdkvx.config import ModelDims, PDConfig
from pdkvx.handles import KVTransferHandle, TransferState

__all__ = ["ModelDims", "PDConfig", "KVTransferHandle", "TransferState"]
__version__ = "0.3.0"
