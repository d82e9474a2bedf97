"""Shared-expert side-stream MoE server: configuration, batches, streams and the MoE layer."""

from sidemoe.config import ServeConfig, default_prefill_workspace_bytes
from sidemoe.streams import SideStreamPair

__all__ = ["ServeConfig", "SideStreamPair", "default_prefill_workspace_bytes"]
