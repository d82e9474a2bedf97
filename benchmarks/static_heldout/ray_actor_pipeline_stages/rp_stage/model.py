from typing import Optional

import torch
from torch import nn

from raypp import PipelineConfig, StageSpec
from rp_stage.attention import StageAttention


class StageLayer(nn.Module):
    def __init__(self, cfg: PipelineConfig, layer_id: int, attn: StageAttention):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        h = cfg.hidden_size
        self.norm = nn.RMSNorm(h)
        self.qkv = nn.Linear(h, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.mlp = nn.Sequential(nn.RMSNorm(h), nn.Linear(h, cfg.intermediate_size, bias=False), nn.SiLU(),
                                 nn.Linear(cfg.intermediate_size, h, bias=False))

    def forward(self, x: torch.Tensor, slots: torch.Tensor, kv_cache: torch.Tensor, bi: Optional[int]) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        page = kv_cache.shape[2]
        kv_cache[slots // page, 0, slots % page] = k.view(-1, self.nkv, self.hd)
        kv_cache[slots // page, 1, slots % page] = v.view(-1, self.nkv, self.hd)
        out = self.attn.attend(q.view(-1, self.nq, self.hd), kv_cache, self.layer_id, bi)
        x = x + self.o_proj(out.flatten(1))
        return x + self.mlp(x)


class StageModel(nn.Module):
    """The slice of layers one actor owns; the first stage embeds, the last
    projects to the vocabulary."""

    def __init__(self, cfg: PipelineConfig, spec: StageSpec, attn: StageAttention):
        super().__init__()
        h = cfg.hidden_size
        self.embed = nn.Embedding(cfg.vocab_size, h) if spec.is_first else None
        self.layers = nn.ModuleList([StageLayer(cfg, i, attn) for i in range(spec.first_layer, spec.last_layer)])
        self.norm = nn.RMSNorm(h) if spec.is_last else None
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False) if spec.is_last else None
        self.clip = cfg.hidden_clip
        shape = (cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=cfg.dtype, device=cfg.device) for _ in self.layers]

    def forward(self, x: torch.Tensor, slots: torch.Tensor, bi: Optional[int]) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, slots, kv, bi)
        if self.clip is not None and (h.abs() > self.clip).any():  # expect: FC101
            h = h.clamp(-self.clip, self.clip)
        if self.lm_head is not None:
            return self.lm_head(self.norm(h))
        return h
