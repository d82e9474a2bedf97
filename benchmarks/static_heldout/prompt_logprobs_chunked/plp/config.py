from dataclasses import dataclass
from typing import Tuple


@dataclass
class LogprobConfig:
    vocab_size: int = 128256
    hidden: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    chunk_size: int = 2048
    max_batch: int = 128
    max_num_tokens: int = 8192
    max_pages: int = 131072
    max_pages_per_seq: int = 8192
    max_prompt_logprobs: int = 20
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    use_trtllm_prefill: bool = False
    use_graphs: bool = True

    @property
    def gqa_ratio(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    def decode_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.head_dim * 4 * 32 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * self.head_dim * 2 + (32 << 20)
