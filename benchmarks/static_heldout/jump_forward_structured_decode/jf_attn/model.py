from __future__ import annotations

import flashinfer
import torch
from torch import nn

from jf.batch import MixedBatch
from jf.config import JFConfig

from .backend import MixedAttnBackend


class JFAttention(nn.Module):
    def __init__(self, cfg: JFConfig, layer_id: int, backend: MixedAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def _project(self, h: torch.Tensor, b: MixedBatch) -> torch.Tensor:
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.cfg.num_heads, self.cfg.head_dim)
        k = k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        v = v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        flashinfer.apply_rope_pos_ids_inplace(q, k, b.positions)
        flashinfer.append_paged_kv_cache(
            k,
            v,
            b.batch_indices,
            b.positions,
            self.backend.pool.layers[self.layer_id],
            b.kv_indices,
            b.kv_indptr,
            b.kv_last_page_len,
            kv_layout="HND",
        )
        return q

    def forward_decode(self, h: torch.Tensor, b: MixedBatch) -> torch.Tensor:
        o = self.backend.forward_decode(self._project(h, b), self.layer_id, b)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_mixed(self, h: torch.Tensor, b: MixedBatch) -> torch.Tensor:
        q = self._project(h, b)
        if self.backend.use_trtllm_context and b.all_new_prompts:
            o = self.backend.forward_prompt_trtllm(q, self.layer_id, b)
        else:
            o = self.backend.forward_mixed(q, self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1))


class JFModel(nn.Module):
    def __init__(self, cfg: JFConfig, backend: MixedAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([JFAttention(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, b: MixedBatch) -> torch.Tensor:
        h = self.embed(b.input_ids)
        for layer in self.layers:
            h = h + layer.forward_decode(h, b)
        return self.lm_head(self.norm(h))

    def forward_mixed(self, b: MixedBatch) -> torch.Tensor:
        h = self.embed(b.input_ids)
        for layer in self.layers:
            h = h + layer.forward_mixed(h, b)
        return self.lm_head(self.norm(h[b.last_rows]))
