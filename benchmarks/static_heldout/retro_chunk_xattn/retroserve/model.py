import torch
from torch import nn

from retroserve.attn_backend import RetroAttnBackend, RetroForwardBatch
from retroserve.settings import RetroSettings


class RetroBlock(nn.Module):
    def __init__(self, settings: RetroSettings, backend: RetroAttnBackend, layer_id: int):
        super().__init__()
        self.backend = backend
        self.has_cca = layer_id >= 6 and layer_id % 3 == 0
        hidden = settings.num_heads * settings.head_dim
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.xq = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        self.h = settings.num_heads
        self.d = settings.head_dim

    def forward(self, x, kv_cache, fb: RetroForwardBatch):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(-1, self.h, self.d)
        if fb.is_decode:
            attn = self.backend.forward_decode(q, kv_cache, fb)
        else:
            attn = self.backend.forward_extend(q, kv_cache)
        x = x + self.o(attn.reshape(x.shape))
        if self.has_cca and fb.neighbour_states is not None:
            nk = fb.neighbour_states.view(-1, self.h, self.d)
            xq = self.xq(x).view(-1, self.h, self.d)
            x = x + self.backend.forward_xattn(xq, nk, nk).reshape(x.shape)
        return x


class RetroModel(nn.Module):
    def __init__(self, settings: RetroSettings, backend: RetroAttnBackend):
        super().__init__()
        hidden = settings.num_heads * settings.head_dim
        self.embed = nn.Embedding(50432, hidden)
        self.layers = nn.ModuleList([RetroBlock(settings, backend, i) for i in range(24)])
        self.lm_head = nn.Linear(hidden, 50432, bias=False)

    def forward(self, input_ids, kv_caches, fb: RetroForwardBatch):
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, kv, fb)
        return self.lm_head(x)
