from __future__ import annotations

import torch
from torch import nn

from warmstart.attn.backend import RestoreFlashInferBackend
from warmstart.config import RestartConfig
from warmstart.forward_batch import ForwardBatch, ForwardMode
from warmstart.kv.pool import PagedKVPool, ReqToPageTable
from warmstart_rt.graph_runner import CudaGraphRunner


class AttentionBlock(nn.Module):
    def __init__(self, cfg: RestartConfig, backend: RestoreFlashInferBackend, layer_id: int):
        super().__init__()
        self.backend = backend
        self.layer_id = layer_id
        self.h, self.kv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kv) * self.d, bias=False, dtype=cfg.dtype)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False, dtype=cfg.dtype)

    def _qkv(self, h: torch.Tensor):
        q, k, v = self.qkv(self.norm(h)).split([self.h * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        return q.view(-1, self.h, self.d), k.view(-1, self.kv, self.d), v.view(-1, self.kv, self.d)

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h)
        o = self.backend.forward_decode(q, k, v, self.layer_id, fb)
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h)
        o = self.backend.forward_extend(q, k, v, self.layer_id, fb)
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class TinyLM(nn.Module):
    def __init__(self, cfg: RestartConfig, backend: RestoreFlashInferBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        self.layers = nn.ModuleList([AttentionBlock(cfg, backend, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=cfg.dtype)

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        return self.lm_head(self.norm(h))


class ModelRunner:
    def __init__(self, cfg: RestartConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.req_to_page = ReqToPageTable(cfg, self.device)
        self.kv_pool = PagedKVPool(cfg, self.device)
        self.attn_backend = RestoreFlashInferBackend(self)
        self.model = TinyLM(cfg, self.attn_backend).to(self.device)
        self.graph_runner = CudaGraphRunner(self)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode == ForwardMode.DECODE:
            return self.model.forward_decode(fb)
        return self.model.forward_extend(fb)
