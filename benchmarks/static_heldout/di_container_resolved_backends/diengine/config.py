from dataclasses import dataclass, field
from typing import List

# The paged prefill wrapper keeps its own float workspace (split-k partials).
WORKSPACE_BYTES = 128 * 1024 * 1024
assert WORKSPACE_BYTES % 4096 == 0  # ok: FC109

PAGE_SIZES = (1, 16, 32)


def default_prefill_ws_bytes():
    return 192 << 20


@dataclass
class EngineConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_bs: int = 160
    max_num_tokens: int = 8192
    max_context: int = 32768
    num_pages: int = 65536
    capture_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 160])
    workspace_bytes: int = 128 << 20
    use_cascade: bool = False
    attention_backend: str = "flashinfer"
    device: str = "cuda"
