"""Engine limits and per-request sampling parameters."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Tuple

# Fixed budgets (MiB) kept from the first prototype; the decode side now sizes
# its workspace from the limits below, the prefill side still reads this table.
_WS_MIB = {"prefill": 256, "decode": 128}


class ProcessorKind(enum.IntFlag):
    NONE = 0
    PENALTIES = 1
    MIN_P = 2
    SEEDED = 4


@dataclass
class EngineConfig:
    max_batch_size: int = 256
    max_model_len: int = 32768
    max_prefill_tokens: int = 8192
    vocab_size: int = 152064
    page_size: int = 16
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    tensor_core_bucket: int = 64
    device: str = "cuda"
    sm_major: int = 9
    eos_token_id: int = 151645

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    @property
    def max_num_pages(self) -> int:
        return self.max_batch_size * self.max_pages_per_req

    @property
    def use_trtllm_decode(self) -> bool:
        return self.sm_major >= 10

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32) and their log-sum-exp for the largest
        # batch, with up to 16 KV chunks per request, plus the planner's ints.
        chunks = 16
        partial = self.max_batch_size * self.num_qo_heads * chunks * (self.head_dim + 1) * 4
        return partial + (self.max_batch_size + 1) * chunks * 64


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: Optional[int] = None
    max_new_tokens: int = 512

    def processors(self) -> ProcessorKind:
        kind = ProcessorKind.NONE
        if (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        ):
            kind |= ProcessorKind.PENALTIES
        if self.min_p > 0.0:
            kind |= ProcessorKind.MIN_P
        if self.seed is not None:
            kind |= ProcessorKind.SEEDED
        return kind
