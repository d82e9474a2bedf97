from typing import List

import torch
from torch import nn

from ev_engine.backend import EventAwareBackend
from ev_engine.batch import EventBatch
from ev_engine.config import EventEngineConfig


class EventLayer(nn.Module):
    def __init__(self, cfg: EventEngineConfig, backend: EventAwareBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        h = cfg.hidden
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.norm = nn.RMSNorm(h)
        self.q_proj = nn.Linear(h, self.q_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, h, bias=False)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h, bias=False), nn.SiLU(), nn.Linear(4 * h, h, bias=False))

    def _q(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(self.norm(x)).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def _out(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        x = x + self.o_proj(o.reshape(o.shape[0], -1))
        return x + self.mlp(x)

    def forward_prefill(self, x, kv_cache, fb: EventBatch) -> torch.Tensor:
        return self._out(x, self.backend.forward_prefill(self._q(x), kv_cache, fb))

    def forward_decode(self, x, kv_cache, bs: int) -> torch.Tensor:
        return self._out(x, self.backend.forward_decode(self._q(x), kv_cache, bs))

    def forward_decode_eager(self, x, kv_cache) -> torch.Tensor:
        return self._out(x, self.backend.forward_decode_eager(self._q(x), kv_cache))


class EventLM(nn.Module):
    def __init__(self, cfg: EventEngineConfig, backend: EventAwareBackend, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList([EventLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        shape = (cfg.num_blocks, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: List[torch.Tensor] = [
            torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)
        ]

    def forward_prefill(self, fb: EventBatch) -> torch.Tensor:
        x = self.embed(fb.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_prefill(x, kv, fb)
        last = (fb.qo_indptr[1:] - 1).long()
        return self.lm_head(self.norm(x.index_select(0, last)))

    def forward_decode(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_decode(x, kv, bs)
        return self.lm_head(self.norm(x))

    def forward_decode_eager(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_decode_eager(x, kv)
        return self.lm_head(self.norm(x))
