from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class ReorderLimits:
    max_batch: int = 192
    max_pages: int = 98304
    page_size: int = 16
    num_layers: int = 28
    hidden: int = 3584
    vocab: int = 152064
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192)
    heavy_rows: int = 4  # the longest rows after sorting get a split-kv wrapper of their own
    heavy_min_pages: int = 2048
    long_tail_pages: int = 8192
    trtllm_ws_bytes: int = 256 << 20
    max_seq_len: int = 131072

    def graph_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 24

    def bucket_for(self, bs: int) -> int:
        for b in self.buckets:
            if b >= bs:
                return b
        return 0
