from dataclasses import dataclass
from typing import Tuple


@dataclass
class FiDConfig:
    vocab_size: int = 32128
    hidden_size: int = 2048
    num_enc_layers: int = 24
    num_dec_layers: int = 24
    num_qo_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 64
    passages_per_query: int = 20
    max_passage_tokens: int = 256
    max_answer_tokens: int = 512
    cross_pool_pages: int = 65536
    self_pool_pages: int = 8192
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48)
    encoder_backend: str = "fa2"

    @property
    def max_cross_pages_per_req(self) -> int:
        return self.passages_per_query * -(-self.max_passage_tokens // self.page_size)

    @property
    def max_self_pages_per_req(self) -> int:
        return -(-self.max_answer_tokens // self.page_size)

    def cross_workspace_bytes(self) -> int:
        # split-k over all passages' pages: partial outputs for the largest batch
        chunks = max(1, self.max_cross_pages_per_req // 8)
        return self.max_batch * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (16 << 20)

    def long_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 256 * (self.head_dim + 2) * 4 + (8 << 20)
