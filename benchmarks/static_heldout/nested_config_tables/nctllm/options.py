"""Typed views of configuration sections, built with ``**cfg[section]``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping


@dataclass
class AttnOptions:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int = 16
    kv_layout: str = "NHD"
    kv_dtype: str = "bfloat16"
    workspace_mb: int = 128
    prefill_backend: str = "fa2"
    decode_backend: str = "fa2"
    sliding_window: int = -1
    window_layers: list = field(default_factory=list)
    shared_prefix_pages: int = 0
    use_tensor_cores: bool = True
    # scratch for the sliding-window decode wrapper; a JSON file may set it per deployment
    window_workspace_bytes: int = 64 << 20

    def __post_init__(self):
        assert self.page_size in (1, 16, 32, 64), "unsupported page size"  # expect: FC109
        self.window_layers = sorted(set(self.window_layers))

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "AttnOptions":
        known = {f.name for f in fields(cls)}
        dims = cfg["model_dims"]
        return cls(
            num_qo_heads=dims["num_qo_heads"],
            num_kv_heads=dims["num_kv_heads"],
            head_dim=dims["head_dim"],
            **{k: v for k, v in cfg["attention"].items() if k in known},
        )

    @property
    def sm_scale(self) -> float:
        return self.head_dim ** -0.5
