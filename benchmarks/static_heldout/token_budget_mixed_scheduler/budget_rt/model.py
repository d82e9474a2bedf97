"""Alternating global and sliding-window layers over one paged pool."""

import torch
from torch import nn

from budget.attn.kv_pool import PagedKVPool
from budget.attn.mixed_backend import MixedFlashInferBackend
from budget.config import BudgetConfig


class _AttnLayer(nn.Module):
    def __init__(self, cfg: BudgetConfig, backend: MixedFlashInferBackend, pool: PagedKVPool, layer_id: int) -> None:
        super().__init__()
        self.backend = backend
        self.pool = pool
        self.layer_id = layer_id
        self.h, self.d = cfg.num_qo_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False),
            nn.SiLU(),
            nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False),
        )

    def _q(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(self.norm(x)).view(-1, self.h, self.d)

    def _finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        x = x + self.o(o.reshape(x.shape[0], -1))
        return x + self.mlp(x)

    def forward_mixed(self, x: torch.Tensor) -> torch.Tensor:
        window = isinstance(self, LocalAttnLayer)
        kv = self.pool.kv_caches[self.layer_id]
        return self._finish(x, self.backend.forward_mixed(self._q(x), kv, window))


class GlobalAttnLayer(_AttnLayer):
    def forward_decode(self, x: torch.Tensor, bs: int) -> torch.Tensor:
        o = self.backend.forward_decode(self._q(x), self.pool.kv_caches[self.layer_id], bs)
        return self._finish(x, o)


class LocalAttnLayer(_AttnLayer):
    def forward_decode(self, x: torch.Tensor, bs: int) -> torch.Tensor:
        o = self.backend.forward_decode_window(self._q(x), self.pool.kv_caches[self.layer_id])
        return self._finish(x, o)


class MixedLM(nn.Module):
    def __init__(self, cfg: BudgetConfig, backend: MixedFlashInferBackend, pool: PagedKVPool) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layers = []
        for i in range(cfg.num_layers):
            if i % 2:
                layers.append(LocalAttnLayer(cfg, backend, pool, i))
            else:
                layers.append(GlobalAttnLayer(cfg, backend, pool, i))
        self.layers = nn.ModuleList(layers)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer.forward_decode(x, bs)
        return self.lm_head(self.norm(x))

    def forward_mixed(self, input_ids: torch.Tensor, logits_rows: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer.forward_mixed(x)
        return self.lm_head(self.norm(x).index_select(0, logits_rows))
