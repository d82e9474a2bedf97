from typing import List

import torch
from torch import nn

from beam_attn.backend import BeamAttentionBackend
from beam_attn.metadata import BeamDecodeMetadata
from beamserve.config import BeamConfig


class BeamAttention(nn.Module):
    def __init__(self, cfg: BeamConfig, layer_id: int, backend: BeamAttentionBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.qkv = nn.Linear(hidden, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, md: BeamDecodeMetadata) -> torch.Tensor:
        qkv = self.qkv(h)
        q = qkv[:, : self.num_heads * self.head_dim].view(-1, self.num_heads, self.head_dim)
        out = self.backend.forward_decode(q, kv_cache[self.layer_id], md)
        return self.o(out.reshape(h.shape[0], -1))


class BeamLM(nn.Module):
    def __init__(self, cfg: BeamConfig, backend: BeamAttentionBackend, vocab: int = 32000):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(vocab, hidden)
        self.layers: List[BeamAttention] = nn.ModuleList(
            [BeamAttention(cfg, i, backend) for i in range(cfg.num_layers)]
        )
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def decode_step(self, tokens: torch.Tensor, kv_cache: torch.Tensor, md: BeamDecodeMetadata) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = h + layer(h, kv_cache, md)
        return torch.log_softmax(self.lm_head(self.norm(h)).float(), dim=-1)
