"""Engine configuration and the sizes derived from it."""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Tuple

import torch

# The eager ragged-prefill planner gets a fixed budget, sized once for 8k-token chunks.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024

# Decode batch sizes that get a captured CUDA graph, ascending.
CAPTURE_BATCH_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)

# Upper bound on the KV splits the decode planner picks per request (split-k).
_MAX_KV_SPLITS = 32


def capture_sizes(max_bs: int) -> Tuple[int, ...]:
    """The captured batch sizes that fit under ``max_bs``."""
    assert CAPTURE_BATCH_SIZES == tuple(sorted(CAPTURE_BATCH_SIZES)), "capture sizes must ascend"  # ok: FC109
    return tuple(filter(functools.partial(operator.ge, max_bs), CAPTURE_BATCH_SIZES))


@dataclasses.dataclass
class EngineConfig:
    model_path: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    page_size: int = 16
    max_batch_size: int = 128
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    # Every ``window_layer_stride``-th layer attends to the last ``sliding_window`` tokens only.
    sliding_window: int = 0
    window_layer_stride: int = 0
    # Length of a system prompt whose pages every request shares (0: none).
    shared_prefix_len: int = 0
    rope_theta: float = 1e6
    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype = torch.bfloat16
    use_cuda_graph: bool = True
    use_trtllm_decode: bool = False
    overlap_kv_stream: bool = False
    sm_major: int = 9
    q_scale: float = 1.0
    frequency_penalty: float = 0.0
    eos_token_id: int = 2
    trtllm_workspace_bytes: int = 128 << 20

    def __post_init__(self) -> None:
        assert self.num_qo_heads % self.num_kv_heads == 0, "query heads must form whole GQA groups"  # expect: FC109
        if self.sliding_window and self.sliding_window < self.page_size:
            raise ValueError(f"sliding_window={self.sliding_window} is shorter than one page ({self.page_size})")
        if self.window_layer_stride and not self.sliding_window:
            raise ValueError("window_layer_stride needs a sliding_window")

    def max_pages_per_request(self) -> int:
        return -(-self.max_context_len // self.page_size)

    def max_total_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_request()

    def window_pages(self) -> int:
        return -(-self.sliding_window // self.page_size) + 1

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32) and their LSEs for the largest decode batch
        per_split = self.num_qo_heads * (self.head_dim + 1) * 4
        return self.max_batch_size * _MAX_KV_SPLITS * per_split + self.max_batch_size * 1024

    def window_workspace_bytes(self) -> int:
        # a window spans few pages: at most four splits per request
        return self.max_batch_size * 4 * self.num_qo_heads * (self.head_dim + 1) * 4

    def extend_workspace_bytes(self) -> int:
        return 2 * self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4
