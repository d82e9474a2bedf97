"""A Llama-shaped decoder whose attention goes through the process-wide FlashInfer backend.

One model per device (``ModelHolder``), shared read-only by the worker threads of that device; the rotary
table is likewise one per device (``RopeTable.for_device``).
"""

from __future__ import annotations

import threading
from typing import ClassVar, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from stl_attn.flashinfer_backend import FlashInferBackend
from stl_attn.kv_pool import KVPool
from stlserve.batch import ForwardBatch
from stlserve.config import EngineConfig


class RopeTable:
    _TABLES: ClassVar[Dict[torch.device, "RopeTable"]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def for_device(cls, device: torch.device) -> "RopeTable":
        table = cls._TABLES.get(device)
        if table is None:
            with cls._lock:
                table = cls._TABLES.get(device)
                if table is None:
                    table = cls(EngineConfig.get_instance(), device)
                    cls._TABLES[device] = table
        return table

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.head_dim = cfg.head_dim
        self.base = 500000.0
        self.device = device
        self.max_pos = 4096
        self.cos_sin = self._compute(0, self.max_pos)

    def _compute(self, start: int, end: int) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=self.device) / self.head_dim
        inv_freq = 1.0 / (self.base**exponents)
        t = torch.arange(start, end, dtype=torch.float32, device=self.device)
        freqs = torch.outer(t, inv_freq)
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    def ensure(self, max_pos: int) -> torch.Tensor:
        """The table, grown to cover ``max_pos`` (prompts longer than any seen so far)."""
        if max_pos > self.max_pos:
            new_max = max(max_pos, 2 * self.max_pos)
            self.cos_sin = torch.cat([self.cos_sin, self._compute(self.max_pos, new_max)], dim=0)  # expect: FC107
            self.max_pos = new_max
        return self.cos_sin


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_q_heads = cfg.num_q_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_size = cfg.num_q_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.split = (q_size, kv_size, kv_size)

    def forward(self, h: torch.Tensor, batch: ForwardBatch, cos_sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(h).split(self.split, dim=-1)
        q = apply_rope(q.view(-1, self.num_q_heads, self.head_dim), batch.positions, cos_sin)
        k = apply_rope(k.view(-1, self.num_kv_heads, self.head_dim), batch.positions, cos_sin)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        o = FlashInferBackend.get_instance().forward(q, k, v, self.layer_id, batch)
        return self.o_proj(o.reshape(-1, self.num_q_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int) -> None:
        super().__init__()
        self.attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)

    def forward(self, h: torch.Tensor, batch: ForwardBatch, cos_sin: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln1(h), batch, cos_sin)
        return h + self.mlp(self.ln2(h))


class MTPHead(nn.Module):
    """One-layer multi-token-prediction head; its attention reads the draft KV layer."""

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.layer_id = cfg.num_layers
        self.num_q_heads = cfg.num_q_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(2 * cfg.hidden_size, cfg.num_q_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_q_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(torch.cat([h, emb], dim=-1)).view(-1, self.num_q_heads, self.head_dim)
        kv = KVPool.for_device(q.device).layer(self.layer_id)
        o = FlashInferBackend.get_instance().forward_draft(q, kv)
        return self.o_proj(o.reshape(-1, self.num_q_heads * self.head_dim))


class LlamaModel(nn.Module):
    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp: Optional[MTPHead] = MTPHead(cfg) if cfg.num_draft_tokens > 0 else None

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        cos_sin = RopeTable.for_device(batch.input_ids.device).ensure(batch.max_seq_len)
        emb = self.embed(batch.input_ids)
        h = emb
        for layer in self.layers:
            h = layer(h, batch, cos_sin)
        h = self.norm(h)
        if not batch.is_decode:
            # only the last token of each request is sampled
            h = h[batch.qo_indptr[1:] - 1]
        logits = self.lm_head(h)
        if self.mtp is not None and batch.is_decode:
            draft_h = self.mtp(h, emb)
            logits = torch.cat([logits, self.lm_head(draft_h)], dim=0)
        return logits


class ModelHolder:
    """One model per device, loaded on first use by whichever worker thread gets there first."""

    _MODELS: ClassVar[Dict[torch.device, LlamaModel]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def model_for(cls, device: torch.device) -> LlamaModel:
        model = cls._MODELS.get(device)
        if model is None:
            with cls._lock:
                model = cls._MODELS.get(device)
                if model is None:
                    cfg = EngineConfig.get_instance()
                    model = LlamaModel(cfg).to(device=device, dtype=cfg.dtype).eval()
                    cls._MODELS[device] = model
        return model
