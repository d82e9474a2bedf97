import enum
from dataclasses import dataclass, field
from typing import List


class WsSize(enum.IntEnum):
    SPARSE = 192 * 1024 * 1024


@dataclass
class QuestConfig:
    max_batch_size: int = 128
    max_pages_per_req: int = 2048
    num_pages: int = 131072
    page_size: int = 16
    num_layers: int = 32
    dense_layers: int = 2
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 32000
    token_budget: int = 2048
    max_splits: int = 32
    prefill_block: int = 64
    local_blocks: int = 8
    sink_blocks: int = 1
    graph_bs: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 48, 64])
    use_trtllm_dense: bool = False
