"""Chunked-vocabulary logits and sampling: the lm_head runs one vocabulary chunk at a time."""

from vocabchunk.settings import ChunkSettings, default_decode_workspace_bytes

__all__ = ["ChunkSettings", "default_decode_workspace_bytes"]
