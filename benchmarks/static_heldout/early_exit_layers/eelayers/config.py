from dataclasses import dataclass, field
from typing import List


@dataclass
class ExitConfig:
    num_layers: int = 32
    layers_per_group: int = 4
    min_depth: int = 2
    max_batch_size: int = 64
    max_pages_per_req: int = 1024
    num_pages: int = 65536
    page_size: int = 16
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 32000
    exit_threshold: float = 0.9
    max_splits: int = 16
    graph_bs: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    use_trtllm_deep: bool = False
    backfill_inline: bool = True

    @property
    def num_groups(self) -> int:
        return self.num_layers // self.layers_per_group
