from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class ServerArgs:
    # shared by the paged-prefill, decode and cross-attention wrappers
    WORKSPACE_BYTES: ClassVar[int] = 384 * 1024 * 1024
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    context_len: int = 32768
    max_total_tokens: int = 1 << 20
    encoder_cache_bytes: int = 4 << 30
    vit_workspace_bytes: int = 64 << 20
    is_blackwell: bool = False
    cuda_graph_bs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
