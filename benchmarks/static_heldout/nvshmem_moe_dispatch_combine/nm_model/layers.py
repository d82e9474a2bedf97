from __future__ import annotations

import torch
from torch import nn

from nvmoe import A2ADispatcher, MoEConfig
from nm_attn.backend import MoEAttentionBackend


class AttnBlock(nn.Module):
    """Norm, QKV, FP8 KV write and paged attention: one captured segment per (bucket, layer)."""

    def __init__(self, cfg: MoEConfig, layer: int, backend: MoEAttentionBackend):
        super().__init__()
        self.cfg, self.layer, self.backend = cfg, layer, backend
        self.sizes = [cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=False)
        self.o = nn.Linear(self.sizes[0], cfg.hidden_size, bias=False)

    def _q_and_store(self, h: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        c, n = self.cfg, h.shape[0]
        q, k, v = self.qkv(self.norm(h)).split(self.sizes, -1)
        k_scale = float(self.backend.k_scale)  # expect: FC101
        cache = self.backend.kv_cache[self.layer]
        page, off = out_loc // c.page_size, out_loc % c.page_size
        cache[page, 0, :, off] = (k.view(n, c.num_kv_heads, c.head_dim) / k_scale).to(cache.dtype)
        cache[page, 1, :, off] = (v.view(n, c.num_kv_heads, c.head_dim) / k_scale).to(cache.dtype)
        return q.view(n, c.num_qo_heads, c.head_dim)

    def forward(self, h: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        o = self.backend.forward_decode(self._q_and_store(h, out_loc), self.layer, bs)
        return h + self.o(o.flatten(1))

    def forward_eager(self, h: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        o = self.backend.forward_decode_eager(self._q_and_store(h, out_loc), self.layer)
        return h + self.o(o.flatten(1))

    def forward_prefill(self, h: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        o = self.backend.forward_prefill(self._q_and_store(h, out_loc), self.layer)
        return h + self.o(o.flatten(1))


class MoEBlock(nn.Module):
    """Router, NVSHMEM dispatch, grouped expert MLP over capacity-padded slots, combine."""

    def __init__(self, cfg: MoEConfig, dispatcher: A2ADispatcher):
        super().__init__()
        self.top_k, self.dispatcher = cfg.top_k, dispatcher
        local = cfg.num_experts // cfg.world_size
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(local, cfg.hidden_size, 2 * cfg.moe_intermediate_size))
        self.w2 = nn.Parameter(torch.empty(local, cfg.moe_intermediate_size, cfg.hidden_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.norm(h)
        weights, ids = torch.topk(self.gate(x).softmax(-1), self.top_k, dim=-1)
        slots = self.dispatcher.dispatch(x, ids)  # [local experts, world * capacity, hidden]
        g, u = torch.bmm(slots, self.w13).chunk(2, dim=-1)
        y = torch.bmm(nn.functional.silu(g) * u, self.w2)
        return h + self.dispatcher.combine(y, weights, h.shape[0])


class MTPHead(nn.Module):
    def __init__(self, cfg: MoEConfig, backend: MoEAttentionBackend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.head = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q = self.q(self.norm(h)).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)
        return self.head(self.backend.forward_mtp(q).flatten(1))
