"""KV transports between prefill workers and the decode pool, chosen by ``PDConfig.transport``."""
from __future__ import annotations

import abc
import threading
from typing import Callable, Dict, List, Optional, Type

import torch

from pdkvx.config import PDConfig
from pdkvx.handles import KVTransferHandle, TransferState

TRANSPORTS: Dict[str, Type["BaseTransport"]] = {}


def register_transport(name: str) -> Callable[[Type["BaseTransport"]], Type["BaseTransport"]]:
    def deco(cls: Type["BaseTransport"]) -> Type["BaseTransport"]:
        TRANSPORTS[name] = cls
        cls.transport_name = name
        return cls

    return deco


class BaseTransport(abc.ABC):
    transport_name = "base"

    def __init__(self, cfg: PDConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._backend = self.transport_name  # ok: FC103
        self._lock = threading.Lock()
        self._inflight: List[KVTransferHandle] = []
        self.src_cache: List[torch.Tensor] = []
        self.dst_cache: List[torch.Tensor] = []
        self.on_landed: Optional[Callable[[KVTransferHandle], None]] = None

    def bind_caches(self, src_cache: List[torch.Tensor], dst_cache: List[torch.Tensor]) -> None:
        if len(src_cache) != len(dst_cache):
            raise ValueError(f"layer count differs: {len(src_cache)} prefill vs {len(dst_cache)} decode")
        self.src_cache, self.dst_cache = src_cache, dst_cache

    @abc.abstractmethod
    def send(self, handle: KVTransferHandle, src_pages_cpu: torch.Tensor) -> None:
        ...

    def poll_landed(self) -> List[KVTransferHandle]:
        with self._lock:
            landed, self._inflight = self._inflight, []
        for h in landed:
            h.state = TransferState.LANDED
            if self.on_landed is not None:
                self.on_landed(h)
        return landed


@register_transport("local")
class LocalCopyTransport(BaseTransport):
    """Both sides on one host: page copies on a side stream, one event per handle."""

    def __init__(self, cfg: PDConfig, device: torch.device):
        super().__init__(cfg, device)
        self.copy_stream = torch.cuda.Stream(device=device)

    def send(self, handle: KVTransferHandle, src_pages_cpu: torch.Tensor) -> None:
        dst = handle.page_ids.long()
        src = src_pages_cpu.to(self.device, non_blocking=True).long()
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            for src_layer, dst_layer in zip(self.src_cache, self.dst_cache):
                dst_layer.index_copy_(0, dst, src_layer.index_select(0, src).to(dst_layer))
            ev = torch.cuda.Event()
            ev.record(self.copy_stream)
        handle.ready_event = ev
        handle.state = TransferState.IN_FLIGHT
        with self._lock:
            self._inflight.append(handle)


def make_transport(cfg: PDConfig, device: torch.device) -> BaseTransport:
    try:
        cls = TRANSPORTS[cfg.transport]
    except KeyError:
        raise ValueError(f"unknown transport {cfg.transport!r}; known: {sorted(TRANSPORTS)}") from None
    return cls(cfg, device)
