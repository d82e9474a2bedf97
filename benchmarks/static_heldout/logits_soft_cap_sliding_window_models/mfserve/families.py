"""The model families served side by side; each brings its own attention variant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional


@dataclass(frozen=True)
class FamilySpec:
    name: str
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    attn_soft_cap: Optional[float] = None  # tanh cap on attention logits (Gemma-2: 50)
    final_soft_cap: Optional[float] = None  # tanh cap on the output logits (Gemma-2: 30)
    window: Optional[int] = None  # sliding window of the local layers, in tokens
    local_every: int = 0  # layers i with i % local_every != local_every - 1 are local
    alibi: bool = False
    decode_backend: str = "fa2"

    def is_local(self, layer_idx: int) -> bool:
        if self.window is None or self.local_every == 0:
            return False
        return layer_idx % self.local_every != self.local_every - 1

    @property
    def pos_encoding_mode(self) -> str:
        return "ALIBI" if self.alibi else "NONE"

    @property
    def window_left(self) -> int:
        return self.window - 1 if self.window else -1


FAMILY_SPECS: Dict[str, FamilySpec] = {
    "gemma2": FamilySpec(
        "gemma2", 26, 8, 4, 256, 256000, attn_soft_cap=50.0, final_soft_cap=30.0, window=4096, local_every=2
    ),
    "mistral": FamilySpec("mistral", 32, 32, 8, 128, 32768, decode_backend="trtllm-gen"),
    "bloom": FamilySpec("bloom", 30, 32, 32, 128, 250880, alibi=True),
}
