"""aiostep: an asyncio-driven serving engine over FlashInfer attention and CUDA graphs."""

from aiostep.batch import Request, ScheduledBatch, last_page_lens
from aiostep.config import EXTEND_WORKSPACE_BYTES, GRAPH_BUCKETS, PAGE_SIZE, EngineConfig
from aiostep.workspaces import scratch_workspace, zeroed_workspace

__all__ = ["EXTEND_WORKSPACE_BYTES", "GRAPH_BUCKETS", "PAGE_SIZE", "EngineConfig", "Request"]
__all__ += ["ScheduledBatch", "last_page_lens", "scratch_workspace", "zeroed_workspace"]
