"""Process-wide engine configuration.

Components never receive the configuration as an argument: they call ``EngineConfig.get_instance()``, which
builds one from the environment on first use unless the launcher ``install()``-ed one after parsing the CLI.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

import torch

PAGE_SIZE = 16
GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)

# The graph runner picks the first bucket >= the batch size, so the table has to stay sorted.
assert GRAPH_BUCKETS == tuple(sorted(GRAPH_BUCKETS)), "GRAPH_BUCKETS must be sorted"  # ok: FC109

# Workspace megabytes per auxiliary wrapper kind, measured on the 8B model at 4k context.
_WS_MIB: Dict[str, int] = {"ragged": 384, "verify": 64}


@dataclass
class EngineConfig:
    model_path: str = "/models/llama-3.1-8b-instruct"
    dtype: torch.dtype = torch.bfloat16
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    num_layers: int = 32
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 14336
    vocab_size: int = 128256
    page_size: int = PAGE_SIZE
    num_pages: int = 32768
    sliding_window: int = 4096
    window_layers: Tuple[int, ...] = ()
    softcap_layers: Tuple[int, ...] = ()
    logits_soft_cap: float = 30.0
    num_workers: int = 2
    devices: Tuple[str, ...] = ("cuda:0",)
    use_trtllm_decode: bool = False
    num_draft_tokens: int = 0
    exact_greedy: bool = False
    prefill_workspace_bytes: int = 256 << 20
    graph_buckets: Tuple[int, ...] = GRAPH_BUCKETS

    # Sliding-window decode only ever sees `sliding_window` tokens per row, so its workspace was sized once.
    WINDOW_WS_BYTES: ClassVar[int] = 48 << 20

    _instance: ClassVar[Optional["EngineConfig"]] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __post_init__(self) -> None:
        assert self.max_batch_size <= self.max_num_tokens, "every decode row needs a token slot"  # expect: FC109
        if self.page_size not in (1, 8, 16, 32, 64):
            raise ValueError(f"page_size={self.page_size} is not supported by the paged KV kernels")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads={self.num_q_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")

    # -- singleton --------------------------------------------------------------------------------------------

    @classmethod
    def get_instance(cls) -> "EngineConfig":
        if cls._instance is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = cls.from_env()
        return cls._instance

    @classmethod
    def _check_not_read_yet(cls) -> None:
        assert cls._instance is None, "EngineConfig.install() called after the config was first read"  # ok: FC109

    @classmethod
    def install(cls, cfg: "EngineConfig") -> "EngineConfig":
        with cls._lock:
            cls._check_not_read_yet()
            cls._instance = cfg
        return cfg

    @classmethod
    def reset(cls) -> None:
        with cls._lock:
            cls._instance = None

    @classmethod
    def from_env(cls) -> "EngineConfig":
        devices = tuple(d for d in os.environ.get("STL_DEVICES", "cuda:0").split(",") if d)
        return cls(
            model_path=os.environ.get("STL_MODEL", "/models/llama-3.1-8b-instruct"),
            max_batch_size=int(os.environ.get("STL_MAX_BS", "64")),
            max_num_tokens=int(os.environ.get("STL_MAX_TOKENS", "8192")),
            num_workers=int(os.environ.get("STL_WORKERS", str(2 * len(devices)))),
            devices=devices,
            use_trtllm_decode=os.environ.get("STL_TRTLLM_DECODE", "0") == "1",
            num_draft_tokens=int(os.environ.get("STL_DRAFT_TOKENS", "0")),
            exact_greedy=os.environ.get("STL_EXACT_GREEDY", "0") == "1",
        )

    # -- derived limits ---------------------------------------------------------------------------------------

    @property
    def decode_backend(self) -> str:
        return "trtllm-gen" if self.use_trtllm_decode else "fa2"

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    @property
    def max_graph_bs(self) -> int:
        return max(b for b in self.graph_buckets if b <= self.max_batch_size)

    def decode_workspace_bytes(self) -> int:
        """Split-k partial outputs of the largest decode batch: rows x heads x chunks x (head_dim + lse)."""
        max_chunks = max(1, self.max_seq_len // 512)
        per_row = self.num_q_heads * max_chunks * (self.head_dim * 4 + 4)
        return max(64 << 20, self.max_batch_size * per_row + (16 << 20))
