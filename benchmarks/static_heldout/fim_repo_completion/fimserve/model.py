import torch
from torch import nn

from fimserve.kernels.attention import FimAttention
from fimserve.limits import ServeLimits


class CodeDecoderLayer(nn.Module):
    def __init__(self, limits: ServeLimits, attn: FimAttention, use_repo: bool):
        super().__init__()
        hidden = limits.num_heads * limits.head_dim
        self.attn = attn
        self.use_repo = use_repo
        self.q_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        self.h = limits.num_heads
        self.d = limits.head_dim

    def forward(self, x, kv_cache, repo_kv, bs: int):
        q = self.q_proj(x).view(-1, self.h, self.d)
        out = self.attn.forward_decode(q, kv_cache, bs)
        if self.use_repo:
            repo_out, _ = self.attn.forward_repo(q, repo_kv)
            out = out + repo_out
        return x + self.o_proj(out.reshape(x.shape))


class CodeModel(nn.Module):
    def __init__(self, limits: ServeLimits, attn: FimAttention):
        super().__init__()
        hidden = limits.num_heads * limits.head_dim
        self.embed = nn.Embedding(49152, hidden)
        self.layers = nn.ModuleList([CodeDecoderLayer(limits, attn, i % 4 == 0) for i in range(32)])
        self.head = nn.Linear(hidden, 49152, bias=False)

    def forward(self, input_ids, kv_caches, repo_kvs, bs: int):
        x = self.embed(input_ids)
        for layer, kv, rkv in zip(self.layers, kv_caches, repo_kvs):
            x = layer(x, kv, rkv, bs)
        return self.head(x)
