"""KV dtype classes and the policy that assigns requests to them."""

from __future__ import annotations

import enum
from typing import Protocol

import torch


class KVClass(enum.Enum):
    BF16 = "bf16"  # interactive, short contexts: exact KV
    FP8 = "fp8"  # long contexts and batch jobs: e4m3 pages with per-page scales


KV_TORCH_DTYPE = {KVClass.BF16: torch.bfloat16, KVClass.FP8: torch.float8_e4m3fn}


class KVClassPolicy(Protocol):
    def __call__(self, prompt_len: int, max_new_tokens: int, priority: int) -> KVClass:
        ...


def default_policy(prompt_len: int, max_new_tokens: int, priority: int) -> KVClass:
    if priority > 0 and prompt_len + max_new_tokens <= 8192:
        return KVClass.BF16
    return KVClass.FP8


@torch.jit.script
def clamp_scales(scales: torch.Tensor, max_val: float) -> torch.Tensor:
    assert max_val > 0.0  # ok: FC109
    return torch.clamp(scales, min=1e-6, max=max_val)
