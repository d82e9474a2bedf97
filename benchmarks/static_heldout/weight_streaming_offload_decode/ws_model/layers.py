"""A Llama-shaped decoder whose layers take their weights as arguments (a device slot's views)."""

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from wstream import LayerWeights, StreamConfig
from ws_attn.backend import OffloadAttentionBackend


class StreamedDecoderLayer(nn.Module):
    def __init__(self, cfg: StreamConfig, layer_id: int, backend: OffloadAttentionBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.is_window = cfg.window > 0 and layer_id % 2 == 1
        self.window_left = cfg.window - 1 if self.is_window else -1
        self.in_norm = nn.RMSNorm(cfg.hidden)
        self.post_norm = nn.RMSNorm(cfg.hidden)

    def forward(self, h: torch.Tensor, w: LayerWeights, kv: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        c = self.cfg
        qkv = F.linear(self.in_norm(h), w.qkv)
        q = qkv[:, : c.num_qo_heads * c.head_dim].view(h.shape[0], c.num_qo_heads, c.head_dim)
        if bs is None:
            a = self.backend.eager_decode(q, kv, self.window_left)
        elif self.is_window:
            a = self.backend.window_decode.run(q, kv)  # expect: FC108
        else:
            a = self.backend.graph_wrappers[bs].run(q, kv)  # ok: FC108
        h = h + F.linear(a.reshape(h.shape[0], -1), w.o)
        gate, up = F.linear(self.post_norm(h), w.gate_up).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, w.down)


class StreamedLM(nn.Module):
    def __init__(self, cfg: StreamConfig, backend: OffloadAttentionBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList([StreamedDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.kv_caches: List[torch.Tensor] = []

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))
