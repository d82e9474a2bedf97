from dataclasses import dataclass, field
from typing import List


@dataclass
class EngineConfig:
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    prefill_chunk: int = 2048
    num_pages: int = 262144
    page_size: int = 16
    max_pages_per_req: int = 2048
    num_layers: int = 28
    sliding_window: int = 4096
    swa_every: int = 2
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    hidden_size: int = 3584
    vocab_size: int = 152064
    max_splits: int = 32
    sm_version: int = 90
    use_holistic: bool = True
    lookahead: bool = True
    eos_token_id: int = 151645
    graph_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128])
