"""Engine limits and workspace sizing for the asyncio step pipeline."""

from __future__ import annotations

from dataclasses import dataclass

PAGE_SIZE = 16
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
assert GRAPH_BUCKETS == tuple(sorted(GRAPH_BUCKETS)), "graph buckets must be ascending"  # ok: FC109
EXTEND_WORKSPACE_BYTES = 256 * 1024 * 1024  # tuned on the 4k-prompt benchmark
_WS_MB = {"window": 96}  # decode groups that do not share the split-k workspace, in MiB


@dataclass(frozen=True)
class EngineConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    page_size: int = PAGE_SIZE
    max_batch: int = 256
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    graph_buckets: tuple[int, ...] = GRAPH_BUCKETS
    layer_kinds: tuple[str, ...] = ("full", "window", "sink", "softcap")
    layer_groups: tuple[str, ...] = ("full", "window", "softcap", "sink")
    window_size: int = 4096
    logits_soft_cap: float = 30.0
    use_trtllm_decode: bool = False
    num_draft_tokens: int = 1
    sink_workspace_bytes: int = 192 * 1024 * 1024
    draft_workspace_bytes: int = 64 * 1024 * 1024

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def split_kv_workspace_bytes(self) -> int:
        chunks = max(1, self.max_seq_len // 4096)
        return (16 << 20) + self.max_num_tokens * chunks * self.num_qo_heads * (self.head_dim + 1) * 4

    def trtllm_workspace_bytes(self) -> int:
        return (4 << 20) + self.max_batch * self.num_qo_heads * self.head_dim * 4 * 8
