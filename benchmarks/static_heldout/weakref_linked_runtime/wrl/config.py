"""Engine configuration and the few constants the runtime shares."""

from __future__ import annotations

from dataclasses import dataclass

# The ragged prefill planner keeps split-kv partial outputs in its float workspace.
# 128 MiB was what the 8k-token benchmark needed.
PREFILL_WORKSPACE_BYTES = 128 * 1024 * 1024

# Graph batch sizes above 4 are multiples of this.
GRAPH_BS_ALIGN = 8


def padded_graph_sizes(max_bs: int) -> tuple[int, ...]:
    """Batch sizes a decode graph is captured for, up to ``max_bs``."""
    assert GRAPH_BS_ALIGN & (GRAPH_BS_ALIGN - 1) == 0, "GRAPH_BS_ALIGN must be a power of two"  # ok: FC109
    if max_bs < 1:
        raise ValueError(f"max_bs must be positive, got {max_bs}")
    sizes = [1, 2, 4] + list(range(GRAPH_BS_ALIGN, max_bs + 1, GRAPH_BS_ALIGN))
    return tuple(s for s in sizes if s <= max_bs)


@dataclass
class EngineConfig:
    model_path: str
    dtype: str = "bfloat16"
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    max_running_requests: int = 1024
    # layers that attend over a sliding window (Gemma/Mistral style); empty for full attention
    swa_layers: tuple[int, ...] = ()
    sliding_window: int = 4096
    decode_backend: str = "fa2"  # "fa2" or "trtllm-gen"
    enable_cuda_graph: bool = True
    enable_prefix_sharing: bool = False
    cuda_graph_max_bs: int = 256
    # float workspace of the FA2 decode wrappers; operators raise it for long contexts
    workspace_bytes: int = 256 * 1024 * 1024
    eos_token_id: int = 128001
    compaction_threshold: float = 0.35

    def __post_init__(self):
        assert self.page_size in (1, 16, 32, 64), f"unsupported page size {self.page_size}"  # expect: FC109
        if self.cuda_graph_max_bs > self.max_batch_size:
            self.cuda_graph_max_bs = self.max_batch_size

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    @property
    def cuda_graph_batch_sizes(self) -> tuple[int, ...]:
        return padded_graph_sizes(self.cuda_graph_max_bs) if self.enable_cuda_graph else ()


def workspace_bytes_for(cfg: EngineConfig) -> int:
    """Float workspace for the split-kv / trtllm-gen paths, derived from the engine's limits."""
    # partial outputs (fp32) and their log-sum-exp for up to 8 kv splits per token, plus the
    # kernel's counters and scheduling metadata
    splits = 8
    partial = cfg.max_num_tokens * cfg.num_qo_heads * cfg.head_dim * 4 * splits
    lse = cfg.max_num_tokens * cfg.num_qo_heads * 4 * splits
    return partial + lse + (16 << 20)
