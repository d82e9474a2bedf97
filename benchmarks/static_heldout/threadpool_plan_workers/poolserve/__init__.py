"""Thread-pool planned FlashInfer decode server."""
from .config import DECODE_BUCKETS, ServeConfig, WsSize
from .records import GraphBuffers, HostPlan, PlanTicket, StepBatch
from .workspaces import draft_workspace, zeroed

__all__ = [
    "DECODE_BUCKETS", "GraphBuffers", "HostPlan", "PlanTicket", "ServeConfig", "StepBatch", "WsSize",
    "draft_workspace", "zeroed",
]
