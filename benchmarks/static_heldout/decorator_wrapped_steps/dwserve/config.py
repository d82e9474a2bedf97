"""Engine limits and workspace sizes."""
from dataclasses import dataclass, field
from typing import Tuple

DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
assert list(DECODE_BUCKETS) == sorted(DECODE_BUCKETS), "buckets must be ascending"  # ok: FC109
# Split-k scratch of the paged prefill wrapper, tuned on the 8k-prompt benchmark.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


def window_workspace_bytes() -> int:
    return 64 << 20  # the window wrapper never splits more than 4k tokens


@dataclass(frozen=True)
class ServeConfig:
    max_batch_size: int = 128
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    max_total_pages: int = 262144
    page_size: int = 16
    num_layers: int = 10
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    sliding_window: int = 4096
    local_chunk: int = 8192
    eos_token_id: int = 128001
    use_trtllm_gen: bool = True
    extend_workspace_bytes: int = 128 * 1024 * 1024
    buckets: Tuple[int, ...] = field(default=DECODE_BUCKETS)
    def __post_init__(self):
        assert self.page_size in (16, 32, 64), f"unsupported page size {self.page_size}"  # expect: FC109
    def split_kv_workspace_bytes(self) -> int:
        return max(self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 8, 32 << 20)
    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 16
