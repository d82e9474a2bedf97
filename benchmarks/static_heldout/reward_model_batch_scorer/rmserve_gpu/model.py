"""The reward model backbone (a Llama-shaped decoder without its LM head, plus reward heads)."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from rmserve.batching import RaggedBatch
from rmserve.kernels.heads import ScalarRewardHead, TokenRewardHead
from rmserve.protocols import ScoreHead
from rmserve.settings import RewardSettings
from rmserve_gpu.pages import CritiquePagePool
from rmserve_gpu.score_attention import RaggedScoreAttention


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None, None] * inv
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], dim=-1).type_as(x)


class RewardLayer(nn.Module):
    def __init__(self, s: RewardSettings, layer_id: int, attn: RaggedScoreAttention, kv_pool: CritiquePagePool):
        super().__init__()
        self.s = s
        self.layer_id = layer_id
        self.attn = attn
        self.kv_pool = kv_pool
        q, kv = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.splits = (q, kv, kv)
        self.qkv = nn.Linear(s.hidden_size, q + 2 * kv, bias=False)
        self.o = nn.Linear(q, s.hidden_size, bias=False)
        self.ln1 = nn.RMSNorm(s.hidden_size)
        self.ln2 = nn.RMSNorm(s.hidden_size)
        self.gate_up = nn.Linear(s.hidden_size, 2 * s.intermediate_size, bias=False)
        self.down = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def qkv_rope(self, h: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.s
        q, k, v = self.qkv(self.ln1(h)).split(self.splits, dim=-1)
        q = rope(q.view(-1, s.num_q_heads, s.head_dim), positions)
        k = rope(k.view(-1, s.num_kv_heads, s.head_dim), positions)
        return q, k, v.view(-1, s.num_kv_heads, s.head_dim)

    def finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o(o.flatten(1))
        g, u = self.gate_up(self.ln2(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(g) * u)

    def forward(self, h: torch.Tensor, batch: RaggedBatch) -> torch.Tensor:
        q, k, v = self.qkv_rope(h, batch.positions_gpu)
        if batch.critique_out_loc_gpu is not None:
            idx = batch.critique_tok_idx_gpu
            self.kv_pool.store(self.layer_id, k.index_select(0, idx), v.index_select(0, idx), batch.critique_out_loc_gpu)
        return self.finish(h, self.attn.forward(q, k, v))


class RewardModel(nn.Module):
    def __init__(self, s: RewardSettings, attn: RaggedScoreAttention, kv_pool: CritiquePagePool):
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList([RewardLayer(s, i, attn, kv_pool) for i in range(s.num_layers)])
        self.final_norm = nn.RMSNorm(s.hidden_size)
        self.head: ScoreHead = ScalarRewardHead(s.hidden_size)
        self.token_head = TokenRewardHead(s.hidden_size)
        # tied to the embedding; only used for critique tokens
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward_score(self, batch: RaggedBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids_gpu)
        for layer in self.layers:
            h = layer(h, batch)
        return self.final_norm(h)
