"""FlashInfer workspaces, owned by one process-wide manager.

``WorkspaceManager()`` always returns the same object (``SingletonMeta``): the first call, made by the
``ModelRunner`` at start-up, may pass the configuration; every later call takes no arguments. Buffers are
keyed by (device, thread): FlashInfer keeps a wrapper's plan in its int workspace and its split-k partials in
the float one, so two threads planning at the same time must not share either.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Dict, Optional, Tuple

import torch

from stlserve.config import _WS_MIB, EngineConfig

_Key = Tuple[torch.device, int, str]


class SingletonMeta(type):
    """Calling a class of this metaclass returns the one instance of it."""

    _instances: Dict[type, Any] = {}
    _lock = threading.RLock()

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        inst = SingletonMeta._instances.get(cls)
        if inst is None:
            with SingletonMeta._lock:
                inst = SingletonMeta._instances.get(cls)
                if inst is None:
                    inst = super().__call__(*args, **kwargs)
                    SingletonMeta._instances[cls] = inst
                    return inst
        # Only the first construction configures the singleton; a later one with arguments is a wiring mistake.
        assert not (args or kwargs), f"{cls.__name__} is a singleton and was already built"  # expect: FC109
        return inst

    @classmethod
    def drop(mcs, cls: type) -> None:
        with mcs._lock:
            mcs._instances.pop(cls, None)

    @classmethod
    def built(mcs, cls: type) -> bool:
        return cls in mcs._instances


class WorkspaceManager(metaclass=SingletonMeta):
    # The MTP draft decodes one token per row with a fixed depth; this tier was measured once and kept.
    DRAFT_TIER_BYTES = 96 * 1024 * 1024

    _TRTLLM_SCRATCH: ClassVar[Dict[Tuple[torch.device, int], torch.Tensor]] = {}
    _cls_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, cfg: Optional[EngineConfig] = None) -> None:
        self.cfg = cfg or EngineConfig.get_instance()
        self._lock = threading.Lock()
        self._buffers: Dict[_Key, torch.Tensor] = {}

    @staticmethod
    def _key(device: torch.device, kind: str) -> _Key:
        return (device, threading.get_ident(), kind)

    def _cached(self, key: _Key) -> Optional[torch.Tensor]:
        with self._lock:
            return self._buffers.get(key)

    def _keep(self, key: _Key, ws: torch.Tensor) -> torch.Tensor:
        with self._lock:
            return self._buffers.setdefault(key, ws)

    # -- per-thread workspaces --------------------------------------------------------------------------------

    def decode_workspace(self, device: torch.device, kind: str = "decode") -> torch.Tensor:
        """Eager FA2 decode wrappers (plain and soft-capped)."""
        key = self._key(device, kind)
        ws = self._cached(key)
        if ws is None:
            ws = torch.empty(self.cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105, FC106
            ws = self._keep(key, ws)
        return ws

    def window_workspace(self, device: torch.device) -> torch.Tensor:
        key = self._key(device, "window")
        ws = self._cached(key)
        if ws is None:
            ws = torch.zeros(self.cfg.WINDOW_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
            ws = self._keep(key, ws)
        return ws

    def graph_workspace(self, device: torch.device) -> torch.Tensor:
        """One workspace for all graph-mode decode wrappers of a thread: its buckets never replay concurrently."""
        key = self._key(device, "graph")
        ws = self._cached(key)
        if ws is None:
            ws = torch.empty(self.cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
            ws = self._keep(key, ws)
        return ws

    def prefill_workspace(self, device: torch.device) -> torch.Tensor:
        key = self._key(device, "prefill")
        ws = self._cached(key)
        if ws is None:
            ws = torch.empty(self.cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105, FC106
            ws = self._keep(key, ws)
        return ws

    def ragged_workspace(self, device: torch.device) -> torch.Tensor:
        key = self._key(device, "ragged")
        ws = self._cached(key)
        if ws is None:
            ws = torch.empty(_WS_MIB["ragged"] << 20, dtype=torch.uint8, device=device)  # expect: FC106
            ws = self._keep(key, ws)
        return ws

    # -- process-wide scratch ---------------------------------------------------------------------------------

    @classmethod
    def trtllm_scratch(cls, device: torch.device) -> torch.Tensor:
        """Scratch of the direct trtllm-gen decode kernel, one per (device, thread), kept on the class."""
        key = (device, threading.get_ident())
        with cls._cls_lock:
            ws = cls._TRTLLM_SCRATCH.get(key)
            if ws is None:
                nbytes = EngineConfig.get_instance().decode_workspace_bytes()
                ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
                cls._TRTLLM_SCRATCH[key] = ws
            return ws

    def release_thread(self, tid: int) -> int:
        """Drop the buffers of a retired thread; returns the bytes released."""
        freed = 0
        with self._lock:
            for key in [k for k in self._buffers if k[1] == tid]:
                freed += self._buffers.pop(key).numel()
        with WorkspaceManager._cls_lock:
            for key in [k for k in WorkspaceManager._TRTLLM_SCRATCH if k[1] == tid]:
                freed += WorkspaceManager._TRTLLM_SCRATCH.pop(key).numel()
        return freed

    def total_bytes(self) -> int:
        with self._lock:
            return sum(t.numel() * t.element_size() for t in self._buffers.values())
