"""Decoder layers split into a `near` half (projections, window attention) and a `tail` half
(LSE merge with the host's partials, output projection, MLP); each half is a graph per bucket."""

from dataclasses import dataclass

import torch
from torch import nn

from hybridattn import HybridConfig, merge_partials

from .window_backend import WindowBackend


@dataclass
class StepStatics:
    """Device buffers the per-layer graphs read and write; the host's partials land in o_far/lse_far."""
    hidden: torch.Tensor
    out_loc: torch.Tensor
    q: torch.Tensor
    o_near: torch.Tensor
    lse_near: torch.Tensor
    o_far: torch.Tensor
    lse_far: torch.Tensor

    @classmethod
    def allocate(cls, cfg: HybridConfig, rows: int, device) -> "StepStatics":
        h, d = cfg.num_qo_heads, cfg.head_dim
        return cls(
            hidden=torch.zeros(rows, cfg.hidden, dtype=cfg.dtype, device=device),
            out_loc=torch.zeros(rows, dtype=torch.int64, device=device),
            q=torch.zeros(rows, h, d, dtype=cfg.dtype, device=device),
            o_near=torch.zeros(rows, h, d, dtype=cfg.dtype, device=device),
            lse_near=torch.zeros(rows, h, dtype=torch.float32, device=device),
            o_far=torch.zeros(rows, h, d, dtype=torch.float32, device=device),
            lse_far=torch.full((rows, h), float("-inf"), dtype=torch.float32, device=device),
        )


class HybridLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: HybridConfig, backend: WindowBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.cfg = cfg
        hq, hkv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.sizes = [hq * d, hkv * d, hkv * d]
        self.norm1 = nn.RMSNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, sum(self.sizes), bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.norm2 = nn.RMSNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden, bias=False), nn.SiLU(),
                                 nn.Linear(4 * cfg.hidden, cfg.hidden, bias=False))

    def near(self, st: StepStatics, bs: int) -> None:
        cfg = self.cfg
        q, k, v = self.qkv(self.norm1(st.hidden[:bs])).split(self.sizes, dim=-1)
        q = q.view(bs, cfg.num_qo_heads, cfg.head_dim)
        self.backend.write_kv(self.layer_id, k.view(bs, cfg.num_kv_heads, -1), v.view(bs, cfg.num_kv_heads, -1),
                              st.out_loc[:bs])
        o, lse = self.backend.attend_near(self.layer_id, q, bs)
        st.q[:bs].copy_(q)
        st.o_near[:bs].copy_(o)
        st.lse_near[:bs].copy_(lse)

    def tail(self, st: StepStatics, bs: int) -> None:
        o = merge_partials(st.o_near[:bs], st.lse_near[:bs], st.o_far[:bs], st.lse_far[:bs])
        h = st.hidden[:bs] + self.o_proj(o.flatten(1))
        st.hidden[:bs].copy_(h + self.mlp(self.norm2(h)))


class HybridModel(nn.Module):
    def __init__(self, cfg: HybridConfig, backend: WindowBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([HybridLayer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def run_near(self, layer: int, st: StepStatics, bs: int) -> None:
        self.layers[layer].near(st, bs)

    def run_tail(self, layer: int, st: StepStatics, bs: int) -> None:
        self.layers[layer].tail(st, bs)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))
