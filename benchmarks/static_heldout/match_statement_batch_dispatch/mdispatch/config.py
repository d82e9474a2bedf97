"""Engine limits and the sizes derived from them."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Tuple

import torch

PAGE_SIZE = 16
assert PAGE_SIZE & (PAGE_SIZE - 1) == 0, "page size must be a power of two"  # ok: FC109

PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024  # ragged prefill scratch; covered the 8k-token launch benchmark
DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
REQUEST_KINDS = ("prefill", "decode", "abort")


def window_workspace_bytes() -> int:  # at most `window` tokens per request: a small split-k buffer
    return 48 << 20


@dataclass
class EngineConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    num_draft_tokens: int = 4
    window: int = 4096
    use_window: bool = False
    logit_cap: float = 0.0
    use_trtllm_decode: bool = False
    decode_workspace_bytes: int = 128 * 1024 * 1024
    buckets: Tuple[int, ...] = DECODE_BUCKETS
    eos_token_id: int = 2

    def split_kv_workspace_bytes(self) -> int:
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4  # split-k partial outputs + LSE in fp32
        return self.max_num_tokens * per_token * 2 + (16 << 20)

    @property
    def max_pages(self) -> int:
        return self.max_batch_size * (self.max_context_len // PAGE_SIZE)


@functools.lru_cache(maxsize=None)
def shared_float_workspace(nbytes: int, device: str) -> torch.Tensor:  # FA2 split-k scratch shared by eager wrappers
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC106
