"""modserve: a paged-attention serving engine built on FlashInfer.

Per-layer attention state (graph inputs, KV scales, rotary caches) lives in
``torch.nn.Module`` buffers so that ``model.to(device)`` places it with the weights
and the runtime can find it by walking the module tree.
"""

from modserve.batch import ForwardBatch, ScheduledReq
from modserve.config import EngineConfig

__all__ = ["EngineConfig", "ForwardBatch", "ScheduledReq"]
