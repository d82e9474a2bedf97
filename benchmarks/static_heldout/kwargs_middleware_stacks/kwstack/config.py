"""Server arguments and the few module-level knobs the engine reads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List

# Fallback FlashInfer workspace for the speculative drafter's prefill wrapper.  It was picked on a
# 7B model at batch 8 and never revisited.
DEFAULT_WORKSPACE_BYTES = 256 * 1024 * 1024

# Megabytes of workspace for the trtllm-gen draft decode path; operators override it per deployment.
DRAFT_WS_MB = int(os.environ.get("KWSTACK_DRAFT_WS_MB", "64"))

# Rebound at start-up by `set_ragged_workspace_bytes` once the scheduler knows its token budget.
RAGGED_WORKSPACE_BYTES = 64 << 20

DEFAULT_PAGE_SIZE = 1
assert (DEFAULT_PAGE_SIZE & (DEFAULT_PAGE_SIZE - 1)) == 0, "page size must be a power of two"  # ok: FC109

# Keywords that FlashInfer's decode plan accepts and that our call sites forward through **kwargs.
DECODE_PLAN_KEYS = (
    "indptr",
    "indices",
    "last_page_len",
    "num_qo_heads",
    "num_kv_heads",
    "head_dim",
    "page_size",
    "pos_encoding_mode",
    "window_left",
    "logits_soft_cap",
    "q_data_type",
    "kv_data_type",
)


def set_ragged_workspace_bytes(nbytes: int) -> None:
    global RAGGED_WORKSPACE_BYTES
    RAGGED_WORKSPACE_BYTES = nbytes


@dataclass
class ServerArgs:
    model_path: str = "meta-llama/Llama-3.1-8B-Instruct"
    device: str = "cuda"
    max_running_requests: int = 256
    max_total_tokens: int = 1 << 20
    chunked_prefill_size: int = 8192
    page_size: int = DEFAULT_PAGE_SIZE
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 32
    vocab_size: int = 128256
    cuda_graph_bs: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    disable_cuda_graph: bool = False
    workspace_bytes: int = 384 * 1024 * 1024
    attention_backend: str = "flashinfer"
    decode_kernel: str = "fa2"
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    log_step_every: int = 50
    sliding_window_size: int = -1
    logit_cap: float = 0.0
