"""The attention module of every decoder layer.

It owns no wrapper: the backend is bound onto it after the model is built
(``model.apply(bind_attention_backend)``), and its per-layer state lives in
registered buffers (``k_scale`` / ``v_scale``) that ``model.to(device)`` moves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from modserve.batch import ForwardBatch

if TYPE_CHECKING:
    from modserve.attention.flashinfer_backend import FlashInferModuleBackend


class PagedAttention(nn.Module):
    def __init__(
        self,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        sliding_window: Optional[int] = None,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.sliding_window = sliding_window
        self.scaling = head_dim**-0.5
        self.register_buffer("k_scale", torch.ones(1, dtype=torch.float32))
        self.register_buffer("v_scale", torch.ones(1, dtype=torch.float32))
        self.attn_backend: Optional["FlashInferModuleBackend"] = None
        self.step_meta = None

    @property
    def window_key(self) -> str:
        return "full" if self.sliding_window is None else "window"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if fb.is_decode:
            return self.attn_backend.forward_decode(q, k, v, self, fb)
        return self.attn_backend.forward_extend(q, k, v, self, fb)

    def extra_repr(self) -> str:
        return f"layer_id={self.layer_id}, window={self.sliding_window}"
