from typing import List

import torch
from torch import nn

from mfserve import MInferenceConfig
from mf_attn.backend import MInferenceBackend
from mf_attn.metadata import PrefillMeta, StepBatch


class MInferenceLayer(nn.Module):
    def __init__(self, cfg: MInferenceConfig, backend: MInferenceBackend, layer_id: int):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.layer_id = layer_id
        h = cfg.hidden
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.norm = nn.RMSNorm(h)
        self.qkv = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=False)
        self.o = nn.Linear(self.q_size, h, bias=False)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h, bias=False), nn.SiLU(), nn.Linear(4 * h, h, bias=False))

    def _split(self, x: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(self.norm(x)).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (
            q.view(-1, cfg.num_qo_heads, cfg.head_dim),
            k.view(-1, cfg.num_kv_heads, cfg.head_dim),
            v.view(-1, cfg.num_kv_heads, cfg.head_dim),
        )

    def forward_decode(self, x: torch.Tensor, kv_cache: torch.Tensor, fb: StepBatch) -> torch.Tensor:
        q, _, _ = self._split(x)
        o = self.backend.forward_decode(q, kv_cache, fb)
        x = x + self.o(o.reshape(o.shape[0], -1))
        return x + self.mlp(x)

    def forward_prefill(self, x, kv_cache, fb: StepBatch, meta: PrefillMeta, new_pages: torch.Tensor):
        q, k, v = self._split(x)
        if self.backend.sparse_active:
            o = self.backend.forward_sparse_prefill(q, k, v, kv_cache, self.layer_id, new_pages)
        else:
            o = self.backend.forward_dense_prefill(q, kv_cache, meta, fb)
        x = x + self.o(o.reshape(o.shape[0], -1))
        return x + self.mlp(x)


class MInferenceLM(nn.Module):
    def __init__(self, cfg: MInferenceConfig, backend: MInferenceBackend, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList([MInferenceLayer(cfg, backend, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        shape = (cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: List[torch.Tensor] = [
            torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)
        ]

    def forward_decode(self, fb: StepBatch) -> torch.Tensor:
        x = self.embed(fb.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_decode(x, kv, fb)
        return self.lm_head(self.norm(x))

    def forward_prefill(self, fb: StepBatch, meta: PrefillMeta, new_pages: torch.Tensor) -> torch.Tensor:
        x = self.embed(fb.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_prefill(x, kv, fb, meta, new_pages)
        last = (meta.qo_indptr[1:] - 1).long()
        return self.lm_head(self.norm(x.index_select(0, last)))
