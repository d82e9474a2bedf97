"""Static limits of one verifier replica."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# Workspace of the graph-mode verify wrappers.  Sized by hand when the server ran
# with 32 requests and 4 draft tokens; never revisited.
VERIFY_WORKSPACE_BYTES = 192 * 1024 * 1024


@dataclass(frozen=True)
class SpecConfig:
    max_batch_size: int = 64
    max_draft_len: int = 8
    page_size: int = 16
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    max_pages: int = 262144
    max_context_len: int = 32768
    long_decode_threshold: int = 16384
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prefill_workspace_bytes: int = 256 * 1024 * 1024
    max_suffix_depth: int = 64
    min_token_prob: float = 0.1
    max_spec_factor: float = 1.0
    extra_stop_ids: Tuple[int, ...] = field(default_factory=tuple)

    def verify_tokens(self, batch_size: int) -> int:
        # every verified row carries its last accepted token plus max_draft_len drafts
        return batch_size * (self.max_draft_len + 1)

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs in fp32 for the largest verify batch
        rows = self.verify_tokens(self.max_batch_size) * self.num_qo_heads
        return rows * (self.head_dim + 1) * 4 * 16
