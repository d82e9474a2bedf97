"""FlashInfer attention backend and per-layer-type workspaces."""

from gemmaserve.attn.backend import GemmaFlashInferBackend, GraphBuffers

__all__ = ["GemmaFlashInferBackend", "GraphBuffers"]
