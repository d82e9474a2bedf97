from dataclasses import dataclass
from typing import ClassVar, Tuple


@dataclass
class SLoRAConfig:
    # prompt batches are capped by the scheduler; one buffer serves every prefill
    PREFILL_WS_BYTES: ClassVar[int] = 384 << 20

    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    pool_pages: int = 24576
    max_batch: int = 128
    max_pages_per_seq: int = 256
    max_rank: int = 64
    max_adapters: int = 256
    lora_scale: float = 2.0
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    sgmv_workspace_bytes: int = 64 << 20
    sm_version: int = 90

    @property
    def page_elems(self) -> int:
        # one page holds K and V of page_size tokens for one layer
        return 2 * self.page_size * self.num_kv_heads * self.head_dim

    @property
    def pages_per_adapter(self) -> int:
        # A (hidden x rank) and B (rank x hidden) of one layer, rounded up to whole pages
        elems = 2 * self.hidden_size * self.max_rank
        return -(-elems // self.page_elems)

    def attn_workspace_bytes(self) -> int:
        chunks = max(1, self.max_pages_per_seq // 16)
        return self.max_batch * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def long_ctx_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 128 * (self.head_dim + 2) * 4 + (16 << 20)
