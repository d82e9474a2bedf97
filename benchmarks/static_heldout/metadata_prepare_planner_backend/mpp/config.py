from dataclasses import dataclass
from typing import Tuple

import torch

DUMMY_PAGE = 0
GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


@dataclass
class BackendConfig:
    num_layers: int = 24
    hidden_size: int = 2048
    vocab_size: int = 102400
    num_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_batch_size: int = 128
    max_num_tokens: int = 16384
    max_context_len: int = 65536
    use_tensor_cores: bool = True
    # MLA (DeepSeek-style latent attention)
    use_mla: bool = False
    use_trtllm_mla: bool = False
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    graph_buckets: Tuple[int, ...] = GRAPH_BUCKETS
    dtype: torch.dtype = torch.bfloat16

    @property
    def pages_per_request(self) -> int:
        return -(-self.max_context_len // self.page_size)

    @property
    def max_pages(self) -> int:
        return self.max_batch_size * self.pages_per_request

    def decode_workspace_bytes(self) -> int:
        splits = max(1, self.max_context_len // 1024)
        return self.max_batch_size * self.num_heads * (self.head_dim + 1) * 4 * splits + (8 << 20)
