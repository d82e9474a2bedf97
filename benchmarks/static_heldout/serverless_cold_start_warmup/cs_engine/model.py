import torch
from torch import nn

from .lazy_backend import LazyFlashInferBackend


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, layer_id: int, backend: LazyFlashInferBackend):
        super().__init__()
        self.layer_id = layer_id
        self.heads = heads
        self.head_dim = head_dim
        self.backend = backend
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q(h).view(-1, self.heads, self.head_dim)
        h = h + self.o(self.backend.forward_decode(q, kv_cache[self.layer_id], bs).reshape(h.shape[0], -1))
        return h + self.mlp(h)


class ServerlessLM(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, head_dim: int, vocab: int,
                 backend: LazyFlashInferBackend):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList([Block(hidden, heads, head_dim, i, backend) for i in range(layers)])
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(tokens)
        for blk in self.blocks:
            h = blk(h, kv_cache, bs)
        return self.head(h)
