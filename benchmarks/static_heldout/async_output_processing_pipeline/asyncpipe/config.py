from dataclasses import dataclass
from typing import Tuple


@dataclass
class PipelineConfig:
    num_layers: int = 26
    num_qo_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 256
    hidden_size: int = 2304
    intermediate_size: int = 9216
    vocab_size: int = 256000
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    page_size: int = 16
    num_pages: int = 32768
    max_batch_size: int = 256
    max_pages_per_seq: int = 512
    max_prefill_tokens: int = 8192
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
    # Gemma-2 style: logit soft-capping on the global-attention layers
    softcap_layers: Tuple[int, ...] = tuple(range(1, 26, 2))
    attn_logit_softcap: float = 50.0
    queue_depth: int = 2
    top_logprobs: int = 5
    eos_token_id: int = 1
    split_kv_chunks: int = 16

    def decode_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * self.split_kv_chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 + (32 << 20)
