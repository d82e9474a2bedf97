"""Model shape and engine limits."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class MLAConfig:
    hidden_size: int = 7168
    num_layers: int = 61
    num_heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    vocab_size: int = 129280
    moe_intermediate_size: int = 2048
    num_experts: int = 256
    num_experts_per_tok: int = 8
    # DeepSeek sparse attention: a lightning indexer picks the top-k tokens per query
    index_topk: int = 2048
    index_n_heads: int = 64
    index_head_dim: int = 128
    sparse_from_layer: int = 3


@dataclass
class EngineConfig:
    model: MLAConfig = field(default_factory=MLAConfig)
    tp_size: int = 8
    ep_size: int = 8
    max_running_requests: int = 256
    max_context_len: int = 32768
    max_total_tokens: int = 1 << 21
    max_num_tokens: int = 16384
    cuda_graph_bs: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128])
    attn_backend: str = "flashinfer"
    trtllm_page_size: int = 64
    reuse_decode_metadata: bool = False

    @property
    def local_heads(self) -> int:
        return self.model.num_heads // self.tp_size

    def mla_workspace_bytes(self) -> int:
        m = self.model
        return self.max_num_tokens * self.local_heads * (m.kv_lora_rank + m.qk_rope_head_dim) * 4 * 2

    def trtllm_workspace_bytes(self) -> int:
        # split-k partials and semaphores for the largest decode batch
        return self.max_running_requests * self.local_heads * self.model.kv_lora_rank * 4 * 8 + (4 << 20)

    def moe_workspace_bytes(self) -> int:
        m = self.model
        return self.max_num_tokens * m.num_experts_per_tok * m.hidden_size * 2 * self.ep_size
