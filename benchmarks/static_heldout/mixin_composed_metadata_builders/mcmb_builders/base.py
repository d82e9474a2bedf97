"""Root of the builder hierarchy: class defaults subclasses override, and a registry by attention type."""
from __future__ import annotations

from typing import ClassVar, Dict, Optional, Type

import torch

from mcmb.batches import AttnMetadata, DecodeBatch
from mcmb.config import BuilderConfig

BUILDERS: Dict[str, Type["MetadataBuilderBase"]] = {}


class MetadataBuilderBase:
    attn_type: ClassVar[str] = ""
    kv_layout: ClassVar[str] = "NHD"
    decode_backend: ClassVar[str] = "fa2"
    supports_cuda_graph: ClassVar[bool] = True
    window_left: int = -1
    GRAPH_WORKSPACE_BYTES: ClassVar[int] = 192 * 1024 * 1024

    def __init_subclass__(cls, attn_type: Optional[str] = None, **kw):
        super().__init_subclass__(**kw)
        if attn_type is not None:
            assert attn_type not in BUILDERS, f"two builders claim attention type {attn_type!r}"  # expect: FC109
            cls.attn_type = attn_type
            BUILDERS[attn_type] = cls

    def __init__(self, *, cfg: BuilderConfig, device: torch.device, **kw):
        super().__init__(**kw)
        self.cfg = cfg
        self.device = device
        self._kv_layout = self.kv_layout  # ok: FC103
        self._sm_scale = cfg.head_dim**-0.5  # ok: FC103

    def plan_kwargs(self) -> Dict[str, object]:
        """Extra plan() keywords; subclasses extend it cooperatively."""
        return {"sm_scale": self._sm_scale}

    def init_graph_wrappers(self) -> None:
        raise NotImplementedError

    def build_for_cudagraph_capture(self, bs: int) -> AttnMetadata:
        raise NotImplementedError

    def plan_replay(self, bs: int, batch: DecodeBatch) -> None:
        raise NotImplementedError

    def run_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        raise NotImplementedError

    def run_prefill(self, q, k, v, kv_cache: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        raise NotImplementedError
