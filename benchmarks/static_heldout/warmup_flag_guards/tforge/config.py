from __future__ import annotations

import os
from dataclasses import dataclass, field

# bytes of the float workspace shared by the eager FlashInfer wrappers
FLASHINFER_WORKSPACE_BYTES = int(os.environ.get("TFORGE_FI_WORKSPACE_BYTES", 384 * 1024 * 1024))


@dataclass
class RunnerConfig:
    architecture: str = "LlamaForCausalLM"
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 160
    max_num_tokens: int = 16384
    max_context_len: int = 32768
    speculative_num_draft_tokens: int = 0
    cuda_graph_bs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 96, 128, 160])
    warmup_num_tokens: list[int] = field(default_factory=lambda: [1, 256, 4096])
    graph_workspace_bytes: int = 128 * 1024 * 1024
    log_stats: bool = False
    device: str = "cuda"
    dtype: str = "bfloat16"

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size
