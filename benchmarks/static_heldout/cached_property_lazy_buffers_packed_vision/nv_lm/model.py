"""Language model over merged text and image embeddings; every layer calls the shared `LMAttention`."""

from __future__ import annotations

from typing import Optional

import torch
from flashinfer.rope import apply_rope_pos_ids_inplace
from torch import nn

from navit import IMAGE_TOKEN_ID
from navit.config import VLMConfig
from navit.packing import LMBatch
from nv_lm.attention import LMAttention


class LMLayer(nn.Module):
    def __init__(self, cfg: VLMConfig, layer_id: int, attn: LMAttention):
        super().__init__()
        self.layer_id, self.attn = layer_id, attn
        self.nq, self.nkv, self.hd, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv = nn.Linear(d, (self.nq + 2 * self.nkv) * self.hd, bias=True)
        self.o_proj = nn.Linear(self.nq * self.hd, d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.SiLU(), nn.Linear(4 * d, d, bias=False))

    def _qkv(self, h: torch.Tensor, fb: LMBatch) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q, k, v = q.view(-1, self.nq, self.hd), k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd)
        apply_rope_pos_ids_inplace(q, k, fb.positions, rope_theta=1e6)
        self.attn.save_kv(self.layer_id, k, v, fb.out_cache_loc)
        return q

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))

    def forward_prefill(self, h: torch.Tensor, fb: LMBatch) -> torch.Tensor:
        return self._finish(h, self.attn.prefill(self._qkv(h, fb), self.layer_id))

    def forward_decode(self, h: torch.Tensor, fb: LMBatch) -> torch.Tensor:
        return self._finish(h, self.attn.decode(self._qkv(h, fb), self.layer_id, fb))


class LMModel(nn.Module):
    def __init__(self, cfg: VLMConfig, attn: LMAttention):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([LMLayer(cfg, i, attn) for i in range(cfg.lm_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def prefill(self, fb: LMBatch, image_embeds: Optional[torch.Tensor]) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        if image_embeds is not None:
            mask = (fb.input_ids == IMAGE_TOKEN_ID).unsqueeze(-1)
            h = h.masked_scatter(mask, image_embeds.to(h.dtype))  # ok: FC101
        for layer in self.layers:
            h = layer.forward_prefill(h, fb)
        last = h[: fb.qo_indptr[-1]][fb.qo_indptr[1:] - 1]  # expect: FC101
        return self.lm_head(self.norm(last))

    def decode_step(self, fb: LMBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, fb)
        return self.lm_head(self.norm(h))
