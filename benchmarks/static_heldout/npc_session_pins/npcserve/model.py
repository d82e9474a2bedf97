"""A small Llama-style dialogue model whose attention goes through NPCAttnBackend."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer import apply_rope_pos_ids_inplace, rmsnorm


class NPCDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id: int, backend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        h, d = cfg.hidden_size, cfg.head_dim
        self.qkv = nn.Linear(h, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * d, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * d, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * 4 * h, bias=False)
        self.down = nn.Linear(4 * h, h, bias=False)
        self.ln1 = nn.Parameter(torch.ones(h))
        self.ln2 = nn.Parameter(torch.ones(h))

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        qkv = self.qkv(rmsnorm(x, self.ln1))
        q, k, v = qkv.split([cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim,
                             cfg.num_kv_heads * cfg.head_dim], dim=-1)
        q = q.view(-1, cfg.num_qo_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        apply_rope_pos_ids_inplace(q, k, positions)
        return q, k, v

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(rmsnorm(x, self.ln2)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, bucket=None) -> torch.Tensor:
        q, k, v = self._qkv(x, positions)
        attn = self.backend.forward_decode(q, self.layer_id, bucket)
        x = x + self.o(attn.reshape(x.shape[0], -1))
        return self._mlp(x)


class NPCDialogueModel(nn.Module):
    def __init__(self, cfg, backend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([NPCDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.emote_head = nn.Linear(cfg.hidden_size, cfg.num_emotes, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket=None):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, bucket)
        h = rmsnorm(h, self.norm)
        return self.lm_head(h), self.emote_head(h)

    def forward_prefill(self, lines, qo_indptr: torch.Tensor) -> torch.Tensor:
        ids = torch.tensor([t for _, line in lines for t in line], dtype=torch.int64).to(qo_indptr.device)
        h = self.embed(ids)
        for layer in self.layers:
            positions = torch.arange(h.shape[0], device=h.device)
            q, k, v = layer._qkv(h, positions)
            h = layer._mlp(h + layer.o(self.backend.forward_prefill(q, layer.layer_id).reshape(h.shape[0], -1)))
        return self.lm_head(rmsnorm(h, self.norm)[qo_indptr[1:] - 1])

    def forward_greeting(self, lines, qo_indptr: torch.Tensor) -> torch.Tensor:
        ids = torch.tensor([t for _, line in lines for t in line], dtype=torch.int64).to(qo_indptr.device)
        h = self.embed(ids)
        for layer in self.layers:
            positions = torch.arange(h.shape[0], device=h.device)
            q, k, v = layer._qkv(h, positions)
            h = layer._mlp(h + layer.o(self.backend.forward_greeting(q, k, v).reshape(h.shape[0], -1)))
        return self.lm_head(rmsnorm(h, self.norm)[qo_indptr[1:] - 1])
