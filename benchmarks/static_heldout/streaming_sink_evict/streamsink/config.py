from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class SinkConfig:
    # graph-mode decode only ever sees window pages, so a fixed workspace was deemed "enough"
    DECODE_WORKSPACE_BYTES: ClassVar[int] = 192 * 1024 * 1024

    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    sink_pages: int = 1
    window_pages: int = 256
    num_pages: int = 65536
    max_running_requests: int = 128
    max_prefill_tokens: int = 16384
    vocab_size: int = 32000
    cuda_graph_bs: list = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
