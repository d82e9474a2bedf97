"""A small decoder whose score layers also report observation-window page mass."""

from typing import List, Tuple

import torch
from torch import nn

from snapkv.attn_backend import SnapDecodeBackend
from snapkv.config import SnapConfig


class DecoderLayer(nn.Module):
    def __init__(self, cfg: SnapConfig, layer_id: int, backend: SnapDecodeBackend):
        super().__init__()
        self.layer_id = layer_id
        self.cfg = cfg
        self.backend = backend
        q_dim = cfg.num_qo_heads * cfg.head_dim
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=False)
        self.o = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )
        self.norm = nn.RMSNorm(cfg.hidden_size)

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int, in_graph: bool) -> torch.Tensor:
        cfg = self.cfg
        q_dim = cfg.num_qo_heads * cfg.head_dim
        qkv = self.qkv(self.norm(h))
        q = qkv[:, :q_dim].view(-1, cfg.num_qo_heads, cfg.head_dim)
        attn = self.backend.forward_decode(q, kv_cache, bs, in_graph)
        h = h + self.o(attn.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class SnapDecoder(nn.Module):
    def __init__(self, cfg: SnapConfig, backend: SnapDecodeBackend, kv_caches: List[torch.Tensor], page_key_means: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches
        self.page_key_means = page_key_means
        self.score_layers = set(cfg.score_layers)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int, in_graph: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        h = self.embed(input_ids)
        mass = torch.zeros(bs, cfg.max_pages_per_req, dtype=torch.float32, device=h.device)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv, bs, in_graph)
            if layer.layer_id in self.score_layers:
                q_win = h.view(bs, cfg.num_qo_heads, -1)[..., : cfg.head_dim]
                mass += self.backend.window_mass(q_win, kv, self.page_key_means[layer.layer_id, :bs])
        return self.head(h), mass
