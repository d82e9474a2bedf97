import torch
from torch import nn

from embedserve.attn.ragged_backend import RaggedEmbedBackend
from embedserve.config import EmbedConfig


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EmbedConfig, backend: RaggedEmbedBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.num_heads * cfg.head_dim)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.GELU(), nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def forward(self, h, rerank=False):
        n = h.shape[0]
        q, k, v = self.qkv(h).view(n, 3, self.cfg.num_heads, self.cfg.head_dim).unbind(1)
        o = self.backend.forward(q, k, v)
        if rerank:
            # documents also attend to the cached query prefix; the two partial outputs are summed after scaling
            o = o + self.backend.forward_prefix(q)
        h = h + self.o(o.reshape(n, -1))
        return h + self.mlp(h)


class EncoderModel(nn.Module):
    def __init__(self, cfg: EmbedConfig, backend: RaggedEmbedBackend, num_layers=12):
        super().__init__()
        self.embed = nn.Embedding(30522, cfg.hidden_size)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.hidden_size)
        self.layers = nn.ModuleList([EncoderLayer(cfg, backend) for _ in range(num_layers)])

    def forward(self, input_ids, positions, rerank=False):
        h = self.embed(input_ids) + self.pos(positions)
        for layer in self.layers:
            h = layer(h, rerank)
        return h
