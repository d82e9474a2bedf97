"""Engine limits of the defragmenting decode server."""

from dataclasses import dataclass
from typing import Tuple

# The ragged prefill runs one prompt batch at a time; sized once for "long enough" prompts.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class DefragConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 16384
    max_batch: int = 256
    max_pages_per_seq: int = 512
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 192)
    # compaction: start a pass once this fraction of the pages below the high-water mark are holes
    frag_threshold: float = 0.35
    moves_per_pass: int = 1024
    long_context_pages: int = 256

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs for the largest batch, plus the planner's int scratch
        chunks = max(1, self.max_pages_per_seq // 32)
        partial = self.max_batch * self.num_qo_heads * chunks * (self.head_dim + 1) * 4
        return partial + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA counters and partials of trtllm-gen decode for the largest batch
        return self.max_batch * self.num_qo_heads * 64 * (self.head_dim + 2) * 4 + (8 << 20)
