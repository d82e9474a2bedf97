"""Engine configuration and the few constants every module agrees on."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

PAGE_SIZE = 16

# Batch sizes that get their own captured decode graph (powers of two, then steps of 32).
DEFAULT_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128)

# Float workspace of the prototype wrappers. The prototype is built once, before the
# first batch is seen, so it gets the size the benchmark needed.
PROTO_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class EngineConfig:
    model_path: str
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 128256
    page_size: int = PAGE_SIZE
    num_pages: int = 65536
    max_batch_size: int = 128
    max_context_len: int = 32768
    max_num_tokens: int = 16384
    cuda_graph_buckets: Tuple[int, ...] = DEFAULT_BUCKETS
    # True: bucket runners are copy.copy clones over the prototype's buffers (one set of
    # max-size buffers, each graph reads views of it). False: copy.deepcopy clones.
    share_graph_buffers: bool = True
    # True: buckets below the largest reuse its graph wrapper through a shallow copy.
    clone_graph_wrappers: bool = False
    private_wrapper_workspace: bool = False
    use_trtllm_decode: bool = False
    trtllm_graph_wrappers: bool = False
    shared_prefix_cascade: bool = False
    sliding_window_pages: Optional[int] = None
    num_speculative_tokens: int = 0
    workspace_bytes: int = 128 << 20
    overlap_schedule: bool = False
    eos_token_id: int = 2
    pad_token_id: int = 0
    kv_dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"

    def __post_init__(self):
        assert self.max_batch_size >= max(self.cuda_graph_buckets)  # expect: FC109
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size={self.page_size} must be a power of two")

    @property
    def max_pages_per_step(self) -> int:
        return self.max_batch_size * (self.max_context_len // self.page_size + 1)

    def cascade_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 o + lse) for every query row of both levels
        rows = self.max_batch_size * (self.num_speculative_tokens + 1)
        return 2 * rows * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (8 << 20)
