import os
from dataclasses import dataclass
from typing import Tuple

TIER_GPU = 0
TIER_CPU = 1
TIER_NVME = 2

# Ragged prefill runs only for fresh prompts (no cached prefix); operators tune it per box.
RAGGED_WS_BYTES = int(os.environ.get("KVTIER_RAGGED_WS_MB", "256")) << 20

# floor for the eager decode workspace on tiny test configs
MIN_EAGER_WS_BYTES = 16 << 20


@dataclass
class TierConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_gpu_pages: int = 65536
    num_cpu_pages: int = 262144
    num_logical_pages: int = 1 << 22
    nvme_path: str = "/mnt/nvme0/kvtier.bin"
    max_batch_size: int = 256
    max_num_tokens: int = 16384
    max_pages_per_step: int = 262144
    graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    staged_layers: Tuple[int, ...] = (28, 29, 30, 31)
    decode_workspace_bytes: int = 256 << 20
    use_trtllm_gen: bool = True
    prefetch_batches: int = 2

    @property
    def page_bytes(self) -> int:
        return 2 * self.page_size * self.num_kv_heads * self.head_dim * 2

    def extend_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4

    def staged_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * 32 * (self.head_dim + 1) * 4
