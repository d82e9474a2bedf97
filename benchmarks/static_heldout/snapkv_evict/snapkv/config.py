from dataclasses import dataclass, field
from typing import List


@dataclass
class SnapConfig:
    max_batch_size: int = 64
    max_pages_per_req: int = 512
    num_pages: int = 65536
    page_size: int = 16
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    hidden_size: int = 4096
    # observation window (tokens) whose attention mass scores the pages
    window: int = 32
    pool_kernel: int = 7
    score_decay: float = 0.95
    budget_pages: int = 128
    max_victims: int = 16
    evict_interval: int = 8
    score_layers: List[int] = field(default_factory=lambda: [8, 16, 24])
    graph_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    graph_workspace_mib: int = 128
    max_splits: int = 32
    use_trtllm: bool = False
