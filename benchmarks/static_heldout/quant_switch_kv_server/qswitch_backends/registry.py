"""Backend classes by name, and the dispatcher the model calls (one active KV class per forward)."""

from __future__ import annotations

from typing import Dict, Type

import torch

from qswitch.config import SwitchConfig
from qswitch.dtypes import KVClass
from qswitch.metadata import DecodeMetadata
from qswitch.pool import QuantKVPool
from qswitch.workspaces import WorkspacePool
from qswitch_backends.base import KVBackend
from qswitch_backends.bf16 import Bf16Backend
from qswitch_backends.fp8 import Fp8Backend

BACKENDS: Dict[str, Type[KVBackend]] = {"bf16": Bf16Backend, "fp8": Fp8Backend}


def make_backend(name: str, cfg: SwitchConfig, pool: QuantKVPool, ws: WorkspacePool, device: torch.device) -> KVBackend:
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown KV backend {name!r}; known: {sorted(BACKENDS)}") from None
    return cls(cfg, pool, ws, device)


class QuantAttention:
    """Routes the model's attention calls to the backend of the KV class being decoded."""

    def __init__(self, fp8: Fp8Backend, bf16: Bf16Backend):
        self.fp8 = fp8
        self.bf16 = bf16
        self.active = KVClass.BF16

    def select(self, kv_class: KVClass) -> None:
        self.active = kv_class

    def init_forward_metadata(self, meta: DecodeMetadata) -> None:
        if self.active is KVClass.FP8:
            self.fp8.init_forward_metadata(meta)
        else:
            self.bf16.init_forward_metadata(meta)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        if self.active is KVClass.FP8:
            self.fp8.init_forward_metadata_capture_cuda_graph(bs)
        else:
            self.bf16.init_forward_metadata_capture_cuda_graph(bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        if self.active is KVClass.FP8:
            self.fp8.init_forward_metadata_replay_cuda_graph(bs, meta)
        else:
            self.bf16.init_forward_metadata_replay_cuda_graph(bs, meta)

    def forward_decode(self, q: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        if self.active is KVClass.FP8:
            return self.fp8.forward_decode(q, layer_id, bs)
        return self.bf16.forward_decode(q, layer_id, bs)
