"""Attention backends by name; the engine picks one from its config and hands it down to every layer."""
from typing import Dict, Optional, Protocol

import torch

from ice import DecodeBatch, EngineConfig
from ice_attn.flashinfer_backend import FlashInferDecodeBackend
from ice_attn.reference import ReferenceBackend


class AttentionBackend(Protocol):
    graph_wrappers: Dict[int, object]

    def bucket_for(self, bs: int) -> Optional[int]: ...

    def init_forward_metadata(self, batch: DecodeBatch) -> None: ...

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> None: ...

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, windowed: bool) -> torch.Tensor: ...

    def note_appended(self, bs: int) -> None: ...


BACKENDS = {
    "flashinfer": FlashInferDecodeBackend,
    "reference": ReferenceBackend,
}


def make_backend(cfg: EngineConfig, device: torch.device) -> AttentionBackend:
    cls = BACKENDS.get(cfg.attention_backend)
    if cls is None:
        raise ValueError(f"unknown attention backend {cfg.attention_backend!r}; known: {sorted(BACKENDS)}")
    return cls(cfg, device)
