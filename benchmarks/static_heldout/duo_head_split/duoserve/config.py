from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DuoConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    head_pattern_path: str = "patterns/llama3-8b-duo.tsv"
    # fraction of KV heads per layer served as streaming heads
    sparsity: float = 0.5
    sink_tokens: int = 64
    recent_tokens: int = 256
    page_size: int = 16
    num_full_pages: int = 65536
    max_running_requests: int = 256
    max_context_len: int = 131072
    max_prefill_tokens: int = 16384
    cuda_graph_bs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    graph_ws_mb: int = 128
    disable_cuda_graph: bool = False
    tp_size: int = 1
    device: str = "cuda"
