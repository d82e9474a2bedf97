"""A small decoder stack (plus an MTP draft head) that hands attention to the shared backend."""
from dataclasses import dataclass
from typing import List

import torch

from attn.flashinfer_backend import FlashInferBackend
from fluentmeta import EngineConfig, ForwardBatch


@dataclass(frozen=True)
class LayerSpec:
    layer_id: int
    sliding_window: int = -1
    logits_soft_cap: float = 0.0


class TinyModel:
    def __init__(self, cfg: EngineConfig, backend: FlashInferBackend, kv_caches: List[torch.Tensor]):
        self.cfg, self.backend, self.kv_caches = cfg, backend, kv_caches
        hidden, kv_width = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split_sizes = [hidden, kv_width, kv_width]
        self.embed = torch.nn.Embedding(32000, hidden)
        self.norm = torch.ones(hidden, device=backend.device)
        self.specs = [
            LayerSpec(i, cfg.sliding_window if i % 2 else -1, cfg.logits_soft_cap if i == 0 else 0.0)
            for i in range(cfg.num_layers)
        ]
        self.qkv = [torch.nn.Linear(hidden, hidden + 2 * kv_width, bias=False) for _ in self.specs]
        self.o_proj = [torch.nn.Linear(hidden, hidden, bias=False) for _ in self.specs]
        self.mtp_proj = torch.nn.Linear(hidden, hidden, bias=False) if cfg.num_draft_tokens else None

    def _qkv(self, i: int, h: torch.Tensor):
        q, k, v = self.qkv[i](torch.nn.functional.rms_norm(h, h.shape[-1:], self.norm)).split(self.split_sizes, dim=-1)
        d = self.cfg.head_dim
        return q.unflatten(-1, (-1, d)), k.unflatten(-1, (-1, d)), v.unflatten(-1, (-1, d))

    def decode(self, batch: ForwardBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        h = torch.where(batch.positions[:, None] >= 0, h, torch.zeros_like(h))  # ok: FC101
        for i, spec in enumerate(self.specs):
            q, _, _ = self._qkv(i, h)
            h = h + self.o_proj[i](self.backend.forward_decode(q, self.kv_caches[i], spec).flatten(1))
        if self.mtp_proj is not None:
            self.backend.forward_draft(self.mtp_proj(h).unflatten(-1, (-1, self.cfg.head_dim)), self.kv_caches[-1])
        self.backend.advance_decode_state()
        return h

    def extend(self, batch: ForwardBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for i in range(len(self.specs)):
            q, k, v = self._qkv(i, h)
            h = h + self.o_proj[i](self.backend.forward_extend(q, k, v, self.kv_caches[i]).flatten(1))
        return h
