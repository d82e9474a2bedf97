from dataclasses import dataclass
from typing import Tuple

PAGE_SIZE = 16

# Scratch for the MLA planner. Measured once on the 8k-token benchmark and kept.
MLA_WORKSPACE_BYTES = 96 * 1024 * 1024


@dataclass
class EngineConfig:
    num_layers: int = 8
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    page_size: int = PAGE_SIZE
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    # layers that use the latent (MLA) attention instead of GQA
    mla_layers: Tuple[int, ...] = (7,)
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    # "fa2" (the FlashInfer decode wrapper), "trtllm" (trtllm-gen) or "xqa"
    decode_kernel: str = "fa2"
    device: str = "cuda"

    @property
    def hidden_size(self) -> int:
        return self.num_qo_heads * self.head_dim
    @property
    def pages_per_request(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    @property
    def max_pages(self) -> int:
        return self.max_batch_size * self.pages_per_request

    def float_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32) and their LSE for the largest step, plus planner slack
        rows = max(self.max_num_tokens, self.max_batch_size * 16)
        per_row = self.num_qo_heads * (self.head_dim * 4 + 4)
        return rows * per_row + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA semaphores and partial results, one slab per (request, head)
        return self.max_batch_size * self.num_qo_heads * 4096 + (8 << 20)

    def xqa_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_kv_heads * self.head_dim * 64
