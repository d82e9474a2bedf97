import os
from dataclasses import dataclass, field

# MiB of FlashInfer prefill workspace; deployments override it through the environment
PREFILL_WS_MB = int(os.environ.get("ASYNC_ENGINE_PREFILL_WS_MB", "256"))


@dataclass
class AsyncEngineConfig:
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    page_size: int = 16
    num_layers: int = 12
    chunk_every: int = 4
    attn_chunk: int = 2048
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 4096
    vocab_size: int = 128256
    rope_original_max: int = 8192
    eos_token_id: int = 2
    stop_token_ids: list = field(default_factory=list)
    use_cuda_graph: bool = True
    use_trtllm_long: bool = False
    long_context_threshold: int = 16384
    initial_eager_pages: int = 4096
    graph_batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 64)

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    @property
    def max_total_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_seq

    def decode_ws_bytes(self) -> int:
        chunks = max(1, self.max_seq_len // 1024)
        return self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (16 << 20)

    def chunk_ws_bytes(self) -> int:
        chunks = max(1, self.attn_chunk // 512)
        return self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def trtllm_ws_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 2) * 4 * 32
