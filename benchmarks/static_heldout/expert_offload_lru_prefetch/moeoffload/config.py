from dataclasses import dataclass, field
from typing import List, Tuple

# Prompt prefill workspace: "big enough for the 8k-token chunk we benchmark with".
PREFILL_WS_BYTES = 192 * 1024 * 1024


@dataclass
class OffloadConfig:
    num_layers: int = 24
    num_experts: int = 64
    top_k: int = 2
    hidden: int = 2048
    ffn: int = 1408
    vocab: int = 102400
    gpu_expert_slots: int = 24          # GPU-resident experts per layer, on average
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 128
    max_pages: int = 65536
    max_seq_len: int = 32768
    window: int = 4096
    window_layers: Tuple[int, ...] = (1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23)
    long_context_threshold: int = 16384
    prefetch_threshold: float = 0.15
    graph_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs for the largest decode batch
        return self.max_batch * self.num_qo_heads * (self.head_dim + 2) * 4 * 16

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.head_dim * 512

    def bucket_for(self, bs: int) -> int:
        for b in self.graph_buckets:
            if b >= bs:
                return b
        return 0
