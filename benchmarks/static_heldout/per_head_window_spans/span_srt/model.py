from __future__ import annotations

from typing import List

import torch
from torch import nn

from span_srt.forward_batch import ForwardBatch
from spanattn.layout import HeadGroupLayout
from spanattn.spans import SpanConfig


class SpanAttentionLayer(nn.Module):
    def __init__(self, cfg: SpanConfig, layer_id: int, layout: HeadGroupLayout):
        super().__init__()
        self.layer_id = layer_id
        self.layout = layout
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        qkv_out = (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, qkv_out, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def _split(self, h: torch.Tensor, fb: ForwardBatch):
        qd = self.num_qo_heads * self.head_dim
        kd = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(h).split([qd, kd, kd], dim=-1)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q_parts = self.layout.split_q(q)
        k_parts = self.layout.split_kv(k)
        v_parts = self.layout.split_kv(v)
        pools = fb.attn_backend.pools
        for g in range(self.layout.num_groups):
            pools[g].store(self.layer_id, k_parts[g], v_parts[g], fb.out_locs[g])
        return q_parts

    def forward_decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q_parts = self._split(h, fb)
        meta = fb.attn_meta
        pools = fb.attn_backend.pools
        outs: List[torch.Tensor] = []
        for g, grp in enumerate(self.layout.groups):
            kv = pools[g].kv[self.layer_id]
            if grp.is_global:
                outs.append(meta.global_wrapper.run(q_parts[g], kv))  # expect: FC108
            else:
                outs.append(meta.local_wrappers[g].run(q_parts[g], kv))  # ok: FC108
        o = self.layout.merge(outs)
        return self.o_proj(o.reshape(o.shape[0], -1))

    def forward_extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q_parts = self._split(h, fb)
        meta = fb.attn_meta
        pools = fb.attn_backend.pools
        outs = [
            meta.prefill_wrappers[g].run(q_parts[g], pools[g].kv[self.layer_id])
            for g in range(self.layout.num_groups)
        ]
        o = self.layout.merge(outs)
        return self.o_proj(o.reshape(o.shape[0], -1))


class SpanModel(nn.Module):
    def __init__(self, cfg: SpanConfig, layout: HeadGroupLayout):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([SpanAttentionLayer(cfg, i, layout) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer.forward_decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer.forward_extend(h, fb)
        return self.lm_head(self.norm(h))
