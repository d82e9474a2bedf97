from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)

# ragged / paged prefill scratch, by prefill kernel family
_PREFILL_WORKSPACE = {"fa2": 512 * 1024 * 1024, "fa3": 768 * 1024 * 1024}


@dataclass
class EngineConfig:
    page_size: int = 16
    max_slots: int = 256
    max_pages_per_slot: int = 2048
    max_context_len: int = 32768
    max_prefill_tokens: int = 8192
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    eos_token_id: int = 128009
    decode_workspace_bytes: int = 256 << 20
    prefill_kernel: str = "fa2"
    # Blackwell: long prompts through trtllm-gen's context kernel
    trtllm_context: bool = False
    compaction_threshold: float = 0.25
    system_prompt_tokens: int = 0
