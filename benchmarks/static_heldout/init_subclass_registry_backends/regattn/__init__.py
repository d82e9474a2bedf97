"""regattn: attention backends looked up by name from the serving config."""

from regattn.batch import ForwardBatch
from regattn.config import DRAFT_WORKSPACE_BYTES, GRAPH_BUCKETS, PAGE_SIZE, ServeConfig, WsTier
from regattn.registry import AttentionBackend, Workspace, make_workspace

__all__ = ["DRAFT_WORKSPACE_BYTES", "GRAPH_BUCKETS", "PAGE_SIZE", "ServeConfig", "WsTier", "ForwardBatch"]
__all__ += ["AttentionBackend", "Workspace", "make_workspace"]
