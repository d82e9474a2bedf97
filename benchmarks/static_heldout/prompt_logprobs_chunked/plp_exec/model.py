from typing import List

import torch
from torch import nn

from plp.config import LogprobConfig
from plp_exec.backend import ChunkedAttentionBackend


class ChunkedLayer(nn.Module):
    def __init__(self, cfg: LogprobConfig, backend: ChunkedAttentionBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        h = cfg.hidden
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.norm = nn.RMSNorm(h)
        self.qkv = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=False)
        self.o = nn.Linear(self.q_size, h, bias=False)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h, bias=False), nn.SiLU(), nn.Linear(4 * h, h, bias=False))

    def _q(self, x: torch.Tensor) -> torch.Tensor:
        q = self.qkv(self.norm(x))[:, : self.q_size]
        return q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def _finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        x = x + self.o(o.reshape(o.shape[0], -1))
        return x + self.mlp(x)

    def forward_extend(self, x: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self._finish(x, self.backend.forward_extend(self._q(x), kv_cache))

    def forward_decode(self, x: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self._finish(x, self.backend.forward_decode(self._q(x), kv_cache, bs))


class ChunkedLM(nn.Module):
    def __init__(self, cfg: LogprobConfig, backend: ChunkedAttentionBackend, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList([ChunkedLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        shape = (cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: List[torch.Tensor] = [
            torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)
        ]

    def forward_extend(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_extend(x, kv)
        return self.lm_head(self.norm(x))

    def forward_decode(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_decode(x, kv, bs)
        return self.lm_head(self.norm(x))
