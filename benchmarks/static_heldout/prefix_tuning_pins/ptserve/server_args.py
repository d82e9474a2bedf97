from __future__ import annotations

import os
from dataclasses import dataclass

# soft-prompt attention scratch, in MiB; operators override it per deployment
PREFIX_WORKSPACE_MB = int(os.environ.get("PT_PREFIX_WORKSPACE_MB", "96"))


@dataclass
class ServerArgs:
    gpu_id: int = 0
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    cuda_graph_max_bs: int = 160
    disable_cuda_graph: bool = False
    enable_trtllm_decode: bool = False
    flashinfer_workspace_size: int = 384 * 1024 * 1024
    graph_workspace_size: int = 256 * 1024 * 1024
    zero_graph_workspace: bool = True
    max_tenants: int = 1024
    max_virtual_tokens: int = 128
    max_total_pages: int = 200_000
    max_pages_per_req: int = 2048
    page_size: int = 16
    max_context_len: int = 32768
    log_replay_every: int = 1000


@dataclass
class ModelConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256


def extend_workspace_bytes(args: ServerArgs, cfg: ModelConfig) -> int:
    # split-k partials of the largest chunk: tokens x heads x (head_dim + lse) x fp32, 4 chunks
    return args.chunked_prefill_size * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 4
