"""ccbi: one attention backend, built by the engine and handed down every constructor."""

from ccbi.config import GRAPH_BATCH_SIZES, PAGE_SIZE, PREFILL_WORKSPACE_BYTES, EngineConfig
from ccbi.forward_batch import ForwardBatch, ForwardMode, SchedBatch

__all__ = ["GRAPH_BATCH_SIZES", "PAGE_SIZE", "PREFILL_WORKSPACE_BYTES", "EngineConfig", "ForwardBatch", "ForwardMode", "SchedBatch"]
