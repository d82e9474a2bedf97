"""Engine limits and the workspace sizes derived from them."""
from dataclasses import dataclass

PAGE_SIZE = 16
assert PAGE_SIZE & (PAGE_SIZE - 1) == 0, "page size must be a power of two"  # ok: FC109
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64)
assert list(GRAPH_BUCKETS) == sorted(GRAPH_BUCKETS), "graph buckets must be ascending"  # ok: FC109
DRAFT_WORKSPACE_BYTES = 96 * 1024 * 1024  # the MTP step never runs more rows than the largest bucket


def window_workspace_bytes() -> int:
    return 64 * 1024 * 1024


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 64
    max_running_requests: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    num_layers: int = 4
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    num_pages: int = 65536
    sliding_window: int = 4096
    logits_soft_cap: float = 30.0
    num_draft_tokens: int = 0
    use_trtllm_decode: bool = False
    prefill_workspace_bytes: int = 256 << 20
    max_pages_per_req: int = 2048  # max_context_len / page_size
    device: str = "cuda"

    def planner_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 o + lse) for every row and head, plus the index arrays
        rows = max(self.max_num_tokens, self.max_batch_size * (self.num_draft_tokens + 1))
        return rows * self.num_qo_heads * (self.head_dim + 1) * 8 + (16 << 20)
