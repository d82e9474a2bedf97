import os
from dataclasses import dataclass
from typing import Tuple

# paged prefill over cached prefixes; operators raise it with OVL_PREFILL_WS_MB when a long prompt fails to plan
PREFILL_WS_BYTES = int(os.getenv("OVL_PREFILL_WS_MB", "256")) << 20


@dataclass
class ServeSettings:
    num_layers: int = 32
    hidden: int = 4096
    vocab: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 256
    max_pages: int = 131072
    max_prefill_tokens: int = 8192
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    sm_version: int = 90
    decode_workspace_bytes: int = 384 << 20
    ring_depth: int = 3
    eos_token_id: int = 128009
    early_eos_check: bool = False
    prompt_logprobs: bool = False
    share_system_prompt: bool = True
    system_prompt_pages: int = 32

    def graph_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.head_dim * 4 * 32

    def bucket_for(self, bs: int) -> int:
        for b in self.graph_buckets:
            if b >= bs:
                return b
        return 0
