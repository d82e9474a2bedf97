from typing import List

import torch
from torch import nn

from fincore.limits import ServeLimits
from fincore.state import DecodeBatch
from finattn.backend import FlashInferAttn


class Layer(nn.Module):
    def __init__(self, limits: ServeLimits, attn: FlashInferAttn, idx: int):
        super().__init__()
        self.limits = limits
        self.attn = attn
        self.is_window = idx % limits.window_every == 0
        self.is_shared = idx == 0
        self.is_verify = idx == limits.num_layers - 1
        hidden = limits.num_heads * limits.head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.kv_proj = nn.Linear(hidden, 2 * limits.num_kv_heads * limits.head_dim, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self._sm_scale = limits.head_dim ** -0.5

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(h.shape[0], self.limits.num_heads, self.limits.head_dim)
        o = self.attn.forward_decode(q, kv_cache, self.is_window, self.is_shared, self.is_verify)
        return h + self.o_proj(o.flatten(1))

    def forward_extend(self, h: torch.Tensor, kv_cache: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        q = self.q_proj(h).view(h.shape[0], self.limits.num_heads, self.limits.head_dim)
        k, v = self.kv_proj(h).view(h.shape[0], 2, self.limits.num_kv_heads, self.limits.head_dim).unbind(1)
        o = self.attn.forward_extend(
            q, k, v, kv_cache, batch.kv_indices, batch.seq_lens, self._sm_scale, ragged=self.is_window  # ok: FC103
        )
        return h + self.o_proj(o.flatten(1))


class Model(nn.Module):
    def __init__(self, limits: ServeLimits, attn: FlashInferAttn, vocab: int = 32000):
        super().__init__()
        hidden = limits.num_heads * limits.head_dim
        self.embed = nn.Embedding(vocab, hidden)
        layers: List[Layer] = [Layer(limits, attn, i) for i in range(limits.num_layers)]
        self.layers = nn.ModuleList(layers)
        shape = (4096, 2, 16, limits.num_kv_heads, limits.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=attn.device) for _ in layers]
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv)
        return self.lm_head(h)

    def forward_extend(self, batch: DecodeBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_extend(h, kv, batch)
        return self.lm_head(h[batch.qo_indptr[1:] - 1])
