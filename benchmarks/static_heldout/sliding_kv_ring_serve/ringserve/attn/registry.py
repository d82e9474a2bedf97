"""Attention backends by configuration name."""

from __future__ import annotations

from typing import Dict, Optional, Type

import torch

from ringserve.attn.base import ForwardBatch, RingAttnBackend
from ringserve.attn.flashinfer_ring import FlashInferRingBackend
from ringserve.config import RingConfig
from ringserve.ring.ring_cache import RingKVCache


class TorchRingBackend(RingAttnBackend):
    name = "torch"

    def __init__(self, cfg, cache, device):
        super().__init__(cfg, cache, device)
        self._batch: Optional[ForwardBatch] = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._batch = batch

    def forward_decode(self, q, k_cache, v_cache, layer_id, is_global):
        rows = self.cache.ring_pages_gpu.index_select(0, self._batch.slots_gpu).clamp(min=0).long()
        rep = self.cfg.num_q_heads // self.cfg.num_kv_heads
        k = k_cache[rows].flatten(1, 2).repeat_interleave(rep, dim=2).transpose(1, 2)
        v = v_cache[rows].flatten(1, 2).repeat_interleave(rep, dim=2).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=self.sm_scale).squeeze(2)

    def forward_extend(self, q, k, v, layer_id):
        raise NotImplementedError("the reference backend only checks decode kernels")


ATTN_BACKENDS: Dict[str, Type[RingAttnBackend]] = {
    "flashinfer": FlashInferRingBackend,
    "torch": TorchRingBackend,
}


def make_backend(name: str, cfg: RingConfig, cache: RingKVCache, device: torch.device) -> RingAttnBackend:
    assert name in ATTN_BACKENDS, f"unknown attention backend {name!r}"  # expect: FC109
    return ATTN_BACKENDS[name](cfg, cache, device)
