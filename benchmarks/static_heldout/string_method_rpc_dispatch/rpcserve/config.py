"""Engine configuration and the module-level limits the engine shares."""

from __future__ import annotations

import os
from dataclasses import dataclass

PAGE_SIZES = (16, 32, 64)
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)

# Scratch for the paged and ragged prefill wrappers. FlashInfer's examples use 128-256 MiB.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024

RPC_TIMEOUT_S = 300.0

assert GRAPH_BATCH_SIZES == tuple(sorted(GRAPH_BATCH_SIZES))  # ok: FC109


def verify_workspace_bytes() -> int:
    """Scratch for the speculative verify wrapper (tunable for benchmark runs)."""
    return int(os.environ.get("RPCSERVE_VERIFY_WS_MB", "64")) << 20


@dataclass
class EngineConfig:
    model: str
    num_layers: int = 32
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    eos_token_id: int = 128001
    sliding_window: int = 4096
    sliding_window_layers: tuple[int, ...] = ()
    page_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    max_pages_per_seq: int = 2048
    num_speculative_tokens: int = 0
    window_workspace_bytes: int = 128 * 1024 * 1024
    decode_kernel: str = "flashinfer"  # or "trtllm" for the direct trtllm-gen decode kernel
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    world_size: int = 1
    log_every_n_steps: int = 50
    capture_modes: tuple[str, ...] = ("decode",)

    def __post_init__(self) -> None:
        assert self.page_size in PAGE_SIZES, f"unsupported page size {self.page_size}"  # expect: FC109
        if self.num_speculative_tokens and "target_verify" not in self.capture_modes:
            self.capture_modes = (*self.capture_modes, "target_verify")

    @property
    def max_graph_bs(self) -> int:
        return max(bs for bs in GRAPH_BATCH_SIZES if bs <= self.max_num_seqs)

    @property
    def tokens_per_decode_req(self) -> int:
        return 1 + self.num_speculative_tokens


def decode_workspace_bytes(cfg: EngineConfig) -> int:
    """Split-k partial outputs of the decode kernels: rows x heads x chunks of fp32 head_dim plus lse."""
    max_chunks = 32
    per_row = cfg.head_dim * 4 + 4
    rows = cfg.max_num_seqs * cfg.tokens_per_decode_req
    return rows * cfg.num_qo_heads * per_row * max_chunks + (16 << 20)
