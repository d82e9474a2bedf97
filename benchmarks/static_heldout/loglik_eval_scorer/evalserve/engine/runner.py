import torch
from torch import nn

from evalserve.engine.attention import EvalAttention
from evalserve.requests import EvalLimits


class EvalLayer(nn.Module):
    def __init__(self, limits: EvalLimits, attn: EvalAttention, windowed: bool):
        super().__init__()
        hidden = limits.num_heads * limits.head_dim
        self.attn = attn
        self.windowed = windowed
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o = nn.Linear(hidden, hidden)
        self.h = limits.num_heads
        self.d = limits.head_dim

    def forward(self, x, kv_cache, bs: int):
        q, k, v = self.qkv(x).view(-1, 3, self.h, self.d).unbind(1)
        out = self.attn.decode(q, kv_cache, bs, self.windowed)
        return x + self.o(out.reshape(x.shape))

    def score(self, x):
        q, k, v = self.qkv(x).view(-1, 3, self.h, self.d).unbind(1)
        out = self.attn.ragged_forward(q, k, v)
        return x + self.o(out.reshape(x.shape))


class EvalModel(nn.Module):
    def __init__(self, limits: EvalLimits, attn: EvalAttention):
        super().__init__()
        hidden = limits.num_heads * limits.head_dim
        self.embed = nn.Embedding(128256, hidden)
        self.layers = nn.ModuleList([EvalLayer(limits, attn, i % 2 == 1) for i in range(32)])
        self.head = nn.Linear(hidden, 128256, bias=False)

    def forward(self, input_ids, kv_caches, bs: int):
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, kv, bs)
        return self.head(x)

    def score(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer.score(x)
        return self.head(x)


class GenerateRunner:
    def __init__(self, limits: EvalLimits, model: EvalModel, attn: EvalAttention, kv_caches, device):
        self.limits = limits
        self.model = model
        self.attn = attn
        self.kv_caches = kv_caches
        self.static_ids = torch.zeros(max(limits.buckets), dtype=torch.long, device=device)
        self.static_lens = torch.ones(max(limits.buckets), dtype=torch.int32, device=device)
        self.graphs = {}
        self.out = {}

    def record_bucket(self, bs: int):
        longest = int(self.static_lens[:bs].max())  # expect: FC101
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.out[bs] = self.model(self.static_ids[:bs], self.kv_caches, bs)
        self.graphs[bs] = g
        return longest

    def decode_step(self, bs: int, token_ids, indptr_cpu, indices, last_len_cpu):
        self.static_ids[:bs].copy_(token_ids)
        self.attn.prepare_decode(bs, indptr_cpu, indices, last_len_cpu)
        self.graphs[bs].replay()
        return self.out[bs].argmax(-1)
