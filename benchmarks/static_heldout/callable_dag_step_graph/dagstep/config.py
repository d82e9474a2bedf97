from dataclasses import dataclass, field
from typing import Tuple

PAGE_SIZE = 16
PREFILL_WS_BYTES = 256 << 20
GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)

assert PAGE_SIZE & (PAGE_SIZE - 1) == 0  # ok: FC109

@dataclass
class EngineConfig:
    num_layers: int = 24
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    max_num_tokens: int = 8192
    max_num_seqs: int = 64
    window: int = 4096
    long_context: int = 32768
    shared_prefix_len: int = 0
    use_trtllm: bool = False
    use_tensor_cores: bool = True
    tc_ws_bytes: int = 128 << 20
    decode_ws_bytes: int = 192 << 20
    graph_buckets: Tuple[int, ...] = field(default_factory=lambda: GRAPH_BUCKETS)

    def workspace_bytes(self) -> int:
        # split-k partials for the largest step the scheduler will build
        return self.max_num_tokens * self.num_heads * (self.head_dim + 1) * 4

    @property
    def max_bucket(self) -> int:
        return max(self.graph_buckets)
