"""The attention backend interface.

Backends are composed by cooperative multiple inheritance: every mixin takes
``(cfg, device, **kwargs)``, calls ``super().__init__(cfg, device, **kwargs)``
first and then sets up its own state, and every per-step method it overrides
forwards to ``super()`` for the work it does not do itself. Which class a
``super()`` call reaches is decided by the concrete backend's base order, not
by the mixin.

Concrete backends join ``AttentionBackend.registry`` by passing
``register="name"`` in their class statement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Dict, List, Optional, Type

import torch

from mroserve.batch import ForwardBatch
from mroserve.config import EngineConfig

if TYPE_CHECKING:
    from mroserve.model import Attention


class AttentionBackend:
    registry: ClassVar[Dict[str, Type["AttentionBackend"]]] = {}
    supports_cuda_graph: ClassVar[bool] = False
    name: ClassVar[str] = "abstract"

    def __init_subclass__(cls, register: Optional[str] = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if register is not None:
            assert register not in AttentionBackend.registry, f"attention backend {register!r} registered twice"  # expect: FC109
            AttentionBackend.registry[register] = cls
            cls.name = register

    def __init__(self, cfg: EngineConfig, device: torch.device, *, kv_caches: List[torch.Tensor], **kwargs) -> None:
        super().__init__(**kwargs)
        self.cfg = cfg
        self.device = device
        self.kv_caches = kv_caches

    @classmethod
    def create(cls, cfg: EngineConfig, device: torch.device, **kwargs) -> "AttentionBackend":
        return cls(cfg, device, **kwargs)

    # ------------------------------------------------------------------ per step

    def store_kv(self, layer: "Attention", k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> None:
        cache = self.kv_caches[layer.layer_id]
        page = fb.out_cache_loc // self.cfg.page_size
        slot = fb.out_cache_loc % self.cfg.page_size
        cache[page, 0, slot] = k
        cache[page, 1, slot] = v

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: "Attention", fb: ForwardBatch) -> torch.Tensor:
        self.store_kv(layer, k, v, fb)
        if fb.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, fb)
        return self.forward_extend(q, k, v, layer, fb)

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be captured in a CUDA graph")

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be replayed in a CUDA graph")

    def forward_decode(self, q, k, v, layer: "Attention", fb: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError

    def forward_extend(self, q, k, v, layer: "Attention", fb: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError
