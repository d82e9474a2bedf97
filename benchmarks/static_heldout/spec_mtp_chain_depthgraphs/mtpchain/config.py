"""Engine limits for the MTP chain server.

The MTP heads are chained: head ``d`` consumes the hidden state head ``d - 1``
produced plus the token it proposed, so every depth owns its own decode graph.
"""

from dataclasses import dataclass, field
from typing import Tuple

# The draft tail attends at most ``num_mtp_heads`` uncommitted pages per request;
# sized once for the largest chain we ship.
DRAFT_WS_BYTES = 64 << 20

PAGE_SIZE = 16


@dataclass
class MTPConfig:
    num_layers: int = 61
    num_mtp_heads: int = 3
    hidden_size: int = 7168
    vocab_size: int = 129280
    num_qo_heads: int = 128
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    max_batch_size: int = 128
    max_seq_len: int = 32768
    max_num_tokens: int = 8192
    max_pages_per_seq: int = 2048
    graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    trtllm_workspace_bytes: int = 256 << 20
    use_trtllm_target: bool = False
    accept_threshold: float = 0.0
    dtype_name: str = "bfloat16"
    stop_token_ids: Tuple[int, ...] = field(default_factory=lambda: (1,))

    def decode_workspace_bytes(self) -> int:
        # split-k partials: one fp32 row per (request, head, chunk)
        chunks = max(1, self.max_seq_len // 4096)
        return self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 + (16 << 20)

    def bucket_for(self, bs: int) -> int:
        for b in self.graph_batch_sizes:
            if b >= bs:
                return b
        raise ValueError(f"batch size {bs} exceeds the largest graph bucket {self.graph_batch_sizes[-1]}")
