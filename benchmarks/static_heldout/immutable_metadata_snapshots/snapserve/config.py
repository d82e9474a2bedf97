"""Engine configuration.

The configuration is a frozen dataclass: every derived configuration (the resolved decode backend,
a draft model's limits, per-deployment overrides) is a `dataclasses.replace` copy, never an edit.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Tuple

PAGE_SIZE = 16

# Batch-size buckets a decode CUDA graph is captured for (largest captured first).
GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)

# Scratch for the MTP draft decode wrapper.  Picked on an 8xH100 box for the 64-request bucket.
DRAFT_WORKSPACE_BYTES = 96 * 1024 * 1024

_KNOWN_BACKENDS = ("fa2", "fa3", "trtllm-gen")


@dataclass(frozen=True)
class EngineConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 4
    vocab_size: int = 32000
    page_size: int = PAGE_SIZE
    max_num_reqs: int = 64
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    sliding_window: int = -1
    window_layer_stride: int = 0
    decode_backend: str = "fa2"
    use_trtllm_decode: bool = False
    enable_draft: bool = False
    num_draft_tokens: int = 1
    # Ragged/paged prefill scratch; deployments override it per model.
    prefill_workspace_bytes: int = 256 * 1024 * 1024
    cuda_graph_buckets: Tuple[int, ...] = GRAPH_BUCKETS
    device: str = "cuda"
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    @property
    def max_total_pages(self) -> int:
        return self.max_num_reqs * self.max_pages_per_req

    def planner_workspace_bytes(self) -> int:
        """Split-k scratch the decode planner may ask for at the engine's limits."""
        max_splits = max(1, self.max_seq_len // (self.page_size * 16))
        partial_o = self.max_num_reqs * self.num_qo_heads * max_splits * self.head_dim * 4
        partial_lse = self.max_num_reqs * self.num_qo_heads * max_splits * 4
        return 2 * (partial_o + partial_lse) + (8 << 20)

    def resolved(self) -> "EngineConfig":
        """The configuration the backend runs with: the trtllm-gen switch folded into `decode_backend`."""
        if self.use_trtllm_decode:
            return replace(self, decode_backend="trtllm-gen")
        return self

    def for_draft(self) -> "EngineConfig":
        return replace(self, num_layers=1, enable_draft=False, cuda_graph_buckets=self.cuda_graph_buckets[:4])

    def with_overrides(self, **overrides: Any) -> "EngineConfig":
        known = {f.name for f in fields(self)}
        assert set(overrides) <= known, f"unknown config keys: {sorted(set(overrides) - known)}"  # expect: FC109
        return replace(self, **overrides)

    def with_env(self) -> "EngineConfig":
        env = {}
        if "SNAP_PREFILL_WS_MB" in os.environ:
            env["prefill_workspace_bytes"] = int(os.environ["SNAP_PREFILL_WS_MB"]) << 20
        if "SNAP_DECODE_BACKEND" in os.environ:
            backend = os.environ["SNAP_DECODE_BACKEND"]
            if backend not in _KNOWN_BACKENDS:
                raise ValueError(f"SNAP_DECODE_BACKEND={backend!r}; expected one of {_KNOWN_BACKENDS}")
            env["decode_backend"] = backend
        return dataclasses.replace(self, **env) if env else self

    def is_window_layer(self, layer_id: int) -> bool:
        return self.sliding_window > 0 and self.window_layer_stride > 0 and layer_id % self.window_layer_stride == 0
