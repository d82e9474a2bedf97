"""KV transfer between a prefill and a decode node."""

from .config import GRAPH_WORKSPACE_BYTES, PAGE_ALIGN, TransferConfig
from .pages import DecodePageTable, PageMapper, TransferManifest
from .rdma import CompletionFlags, RegisteredRegion, Verbs

__all__ = [
    "GRAPH_WORKSPACE_BYTES", "PAGE_ALIGN", "TransferConfig", "DecodePageTable", "PageMapper",
    "TransferManifest", "CompletionFlags", "RegisteredRegion", "Verbs",
]
