"""sdengine: attention backends, workspaces and metadata built by ``functools.singledispatch``."""
from .batches import DecodeBatch, PrefillBatch, Request, TrtllmDecodeBatch
from .config import AttentionConfig, DecodeConfig, EngineConfig, PrefillConfig, TrtllmConfig
from .workspace import make_workspace

__all__ = ["AttentionConfig", "DecodeBatch", "DecodeConfig", "EngineConfig", "PrefillBatch",
           "PrefillConfig", "Request", "TrtllmConfig", "TrtllmDecodeBatch", "make_workspace"]
