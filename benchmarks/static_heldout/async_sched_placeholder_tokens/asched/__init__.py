from .config import DECODE_GRAPH_WORKSPACE_BYTES, DEFAULT_BUCKETS, PLACEHOLDER_TOKEN_ID, AsyncSchedConfig
from .outputs import AsyncOutput, SamplerOutput
from .placeholders import PlaceholderResolver
from .scheduler import AsyncScheduler, Request, SchedulerOutput

__all__ = [
    "DECODE_GRAPH_WORKSPACE_BYTES", "DEFAULT_BUCKETS", "PLACEHOLDER_TOKEN_ID", "AsyncSchedConfig", "AsyncOutput",
    "SamplerOutput", "PlaceholderResolver", "AsyncScheduler", "Request", "SchedulerOutput",
]
