import math
from dataclasses import dataclass, field
from typing import Tuple


@dataclass
class SWAConfig:
    num_layers: int = 32
    global_every: int = 4          # every 4th layer attends to the whole context (Gemma-style)
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    window: int = 4096
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 131072
    num_pages: int = 65536
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    prefill_workspace_bytes: int = 256 * 1024 * 1024
    layer_kinds: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def ring_pages(self) -> int:
        # the window plus one page being filled
        return math.ceil(self.window / self.page_size) + 1

    def is_global(self, layer: int) -> bool:
        return (layer + 1) % self.global_every == 0

    def decode_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 32

    def max_global_pages(self) -> int:
        return math.ceil(self.max_context_len / self.page_size)
