from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List


class LayerKind(str, enum.Enum):
    LOCAL = "local"
    GLOBAL = "global"


@dataclass
class Gemma3Config:
    num_layers: int = 26
    num_qo_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 256
    hidden_size: int = 2304
    intermediate_size: int = 9216
    vocab_size: int = 262144
    sliding_window: int = 1024
    global_every: int = 6
    rope_local_base: float = 10_000.0
    rope_global_base: float = 1_000_000.0
    attn_logit_softcap: float = 50.0
    final_logit_softcap: float = 30.0
    max_batch_size: int = 128
    max_seq_len: int = 32768
    max_prefill_tokens: int = 16384
    local_pages: int = 65536
    global_pages: int = 16384
    graph_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])

    @property
    def query_scale(self) -> float:
        return self.head_dim ** -0.5

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * self.head_dim * 4 * 16 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * self.head_dim * 4 * 2 + (16 << 20)

    def local_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * self.head_dim * 4 * 8 + (16 << 20)


def layer_kinds(cfg: Gemma3Config) -> List[LayerKind]:
    return [LayerKind.GLOBAL if (i + 1) % cfg.global_every == 0 else LayerKind.LOCAL for i in range(cfg.num_layers)]
