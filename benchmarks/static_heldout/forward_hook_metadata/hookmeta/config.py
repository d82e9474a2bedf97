"""Engine limits.  Every buffer the engine keeps for a step is sized from these."""

from dataclasses import dataclass
from typing import Tuple

import torch

# FA2 prefill split-k scratch; "large enough for the prompts we benchmarked".
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024

DEFAULT_DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
assert list(DEFAULT_DECODE_BUCKETS) == sorted(DEFAULT_DECODE_BUCKETS)  # ok: FC109


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


@dataclass(frozen=True)
class EngineConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    sliding_window: int = 4096
    window_every: int = 2
    decode_buckets: Tuple[int, ...] = DEFAULT_DECODE_BUCKETS
    decode_kernel: str = "fa2"  # "fa2" | "trtllm-gen" | "trtllm-raw"
    trtllm_threshold: int = 8192
    enable_cuda_graph: bool = True
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"

    @property
    def max_pages_per_req(self) -> int:
        return ceil_div(self.max_context_len, self.page_size)

    @property
    def max_num_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_req

    def is_sliding(self, layer_id: int) -> bool:
        return self.window_every > 0 and layer_id % self.window_every == 0

    def workspace_bytes(self) -> int:
        # split-k partial outputs (o + lse, fp32) for every token and head, twice for the merge,
        # plus the planner's int section for the largest batch.
        partial = self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2
        ints = (self.max_batch_size + 1) * 8 * 64
        return partial + ints

    def bucket_for(self, batch_size: int) -> int:
        for bucket in self.decode_buckets:
            if bucket >= batch_size:
                return bucket
        raise ValueError(f"batch_size={batch_size} exceeds the largest decode bucket {self.decode_buckets[-1]}")
