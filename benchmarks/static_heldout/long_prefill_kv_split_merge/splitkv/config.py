from dataclasses import dataclass, field
from typing import ClassVar, List

# the wrapper field that tells FlashInfer a wrapper was built for graph capture
GRAPH_FLAG_ATTR = "_use_cuda_graph"


@dataclass
class SplitConfig:
    GRAPH_WORKSPACE_BYTES: ClassVar[int] = 96 * 1024 * 1024

    num_layers: int = 40
    hidden_size: int = 5120
    vocab_size: int = 152064
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 128
    max_pages: int = 262144
    chunk_q_tokens: int = 8192
    chunk_kv_tokens: int = 65536
    max_chunks: int = 16
    eager_workspace_bytes: int = 256 * 1024 * 1024
    split_decode: bool = False
    use_trtllm_single_chunk: bool = False
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])

    @property
    def chunk_kv_pages(self) -> int:
        return self.chunk_kv_tokens // self.page_size

    def chunk_workspace_bytes(self) -> int:
        return self.chunk_q_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    def trtllm_workspace_bytes(self) -> int:
        return self.chunk_q_tokens * self.num_qo_heads * 4 * 64 + (16 << 20)
