"""Attention with one learned sink logit per head; the backend gets the layer to read its sinks and window."""
from typing import TYPE_CHECKING

import torch
from torch import nn

from gptoss.config import GptOssConfig, LayerType

if TYPE_CHECKING:
    from gptoss.backend import SinkAttnBackend


class SinkAttention(nn.Module):
    def __init__(self, cfg: GptOssConfig, layer_id: int, backend: "SinkAttnBackend"):
        super().__init__()
        assert cfg.num_attention_heads % cfg.num_kv_heads == 0  # expect: FC109
        self.layer_id = layer_id
        self.layer_type = cfg.layer_type(layer_id)
        self.window_left = cfg.sliding_window - 1 if self.layer_type is LayerType.SLIDING else -1
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.sinks = nn.Parameter(torch.zeros(cfg.num_attention_heads, dtype=torch.float32))
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size)
        self.backend = backend

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(h).view(h.shape[0], self.num_heads, self.head_dim)

    def forward_decode(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        o = self.backend.forward_decode(self._q(h), kv, self)
        return self.o_proj(o.flatten(1))

    def forward_extend(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        o = self.backend.forward_extend(self._q(h), kv, self)
        return self.o_proj(o.flatten(1))
