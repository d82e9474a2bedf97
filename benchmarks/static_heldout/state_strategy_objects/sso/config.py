"""Engine configuration and the batch kinds the strategy registry is keyed by."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Default FlashInfer float workspace. Chosen on an 8B model at batch 64.
DEFAULT_WORKSPACE_BYTES = 128 * 1024 * 1024

MAX_GRAPH_BATCH_SIZE = 256
assert MAX_GRAPH_BATCH_SIZE % 8 == 0  # ok: FC109


class BatchKind(enum.Enum):
    DECODE = "decode"
    PREFILL = "prefill"
    CASCADE = "cascade"
    IDLE = "idle"


class EngineMode(enum.Enum):
    EAGER = "eager"
    CAPTURING = "capturing"
    REPLAYING = "replaying"


@dataclass
class EngineConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    vocab_size: int = 128256
    hidden_size: int = 4096
    num_layers: int = 32
    max_num_seqs: int = 256
    max_num_tokens: int = 8192
    max_pages: int = 65536
    max_seq_len: int = 32768
    cuda_graph_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    workspace_bytes: int = 256 * 1024 * 1024
    enable_cascade: bool = True
    use_trtllm_decode: bool = False
    enforce_eager: bool = False
    eos_token_id: int = 128001
    device: str = "cuda"

    def __post_init__(self) -> None:
        assert self.max_num_seqs <= MAX_GRAPH_BATCH_SIZE  # expect: FC109
        self.cuda_graph_sizes = sorted(s for s in self.cuda_graph_sizes if s <= self.max_num_seqs)

    @property
    def max_graph_bs(self) -> int:
        return self.cuda_graph_sizes[-1] if self.cuda_graph_sizes else 0
