"""Engine configuration: one frozen pydantic model, validated once at start-up."""

from __future__ import annotations

import math
import os
from typing import Any, ClassVar, Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, PrivateAttr, computed_field, field_validator, model_validator

GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
assert list(GRAPH_BUCKETS) == sorted(GRAPH_BUCKETS)  # ok: FC109

VERIFY_WORKSPACE_BYTES = 128 * 1024 * 1024
# Sliding-window decode keeps its own scratch; operators tune it per model.
SWA_WORKSPACE_BYTES = int(os.environ.get("APM_SWA_WORKSPACE_MIB", "96")) << 20


def prefix_workspace_bytes() -> int:
    return 160 << 20


class EngineConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    GRAPH_WORKSPACE_BYTES: ClassVar[int] = 192 * 1024 * 1024

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int = 128
    page_size: int = 16
    kv_layout: Literal["NHD", "HND"] = "NHD"
    num_layers: int = 32
    max_batch_size: int = 64
    max_seq_len: int = 32768
    max_num_tokens: int = 8192
    sliding_window: Optional[int] = None
    swa_layers: Tuple[int, ...] = ()
    decode_backend: Literal["fa2", "trtllm-gen"] = "fa2"
    num_draft_tokens: int = 0
    eos_token_id: int = 2
    graph_buckets: Tuple[int, ...] = GRAPH_BUCKETS
    prefill_workspace_bytes: int = 384 * 1024 * 1024
    _use_cuda_graph: bool = PrivateAttr(default=True)

    @field_validator("page_size")
    @classmethod
    def check_page_size(cls, v: int) -> int:
        assert v > 0 and v & (v - 1) == 0, "page_size must be a power of two"  # expect: FC109
        return v

    @model_validator(mode="before")
    @classmethod
    def fill_legacy_keys(cls, data: Any) -> Any:
        assert isinstance(data, dict), "EngineConfig expects a mapping"  # expect: FC109
        data = dict(data)
        data.setdefault("sliding_window", data.pop("window", None))
        return data

    @model_validator(mode="after")
    def check_limits(self) -> "EngineConfig":
        if self.num_qo_heads % self.num_kv_heads or (self.swa_layers and self.sliding_window is None):
            raise ValueError(f"inconsistent heads or sliding window: {self!r}")
        self._use_cuda_graph = self.max_batch_size <= self.graph_buckets[-1]  # ok: FC103
        return self

    @computed_field
    @property
    def max_pages_per_seq(self) -> int:
        return math.ceil(self.max_seq_len / self.page_size)  # ok: FC101

    @computed_field
    @property
    def split_kv_workspace_bytes(self) -> int:
        # split-k partial outputs: rows x heads x (head_dim + lse) fp32 for up to 16 chunks, plus the plan area
        rows = max(self.max_num_tokens, self.max_batch_size * (1 + self.num_draft_tokens))
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (32 << 20)

    def plan_dims(self) -> Tuple[int, int, int, int]:
        return (self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)

    def is_swa_layer(self, layer_id: int) -> bool:
        return self.sliding_window is not None and layer_id in self.swa_layers
