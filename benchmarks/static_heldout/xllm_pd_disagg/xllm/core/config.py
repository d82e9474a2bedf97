"""Engine configuration shared by prefill and decode instances."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List


class InstanceRole(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class WorkspaceMiB(enum.IntEnum):
    """Float workspace of each role's FlashInfer wrappers."""

    PREFILL = 512
    DECODE = 128


@dataclass
class EngineConfig:
    role: InstanceRole
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int = 16
    max_model_len: int = 32768
    max_prefill_tokens: int = 16384
    long_prompt_threshold: int = 8192
    max_decode_batch: int = 256
    decode_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    max_pages: int = 1 << 16
    prefill_workspace_bytes: int = 512 << 20
    use_xqa_decode: bool = False
    num_speculative_tokens: int = 0
