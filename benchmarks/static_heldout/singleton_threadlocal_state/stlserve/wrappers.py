"""FlashInfer wrappers.

Decode wrappers belong to one worker thread (``ThreadWrappers``, kept in the thread-local by
``ThreadState.wrappers()``); the graph runner of the thread adds one graph-mode decode wrapper per bucket it has
recorded. Prefill and soft-cap wrappers are fewer and bigger, so they live in a class-level cache keyed by
(thread id, kind) that the memory report can walk.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Dict, FrozenSet, Optional, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from stlserve.config import EngineConfig
from stlserve.thread_state import ThreadState
from stlserve.workspace import WorkspaceManager


class ThreadWrappers:
    """The decode wrappers of one worker thread."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        wm = WorkspaceManager()
        self.device = device
        self._backend = cfg.decode_backend
        self._use_cuda_graph = False
        self._plan_info: Dict[str, Tuple[int, int]] = {}
        self.decode = BatchDecodeWithPagedKVCacheWrapper(
            wm.decode_workspace(device), "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.window = BatchDecodeWithPagedKVCacheWrapper(
            wm.window_workspace(device), "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.draft: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        if cfg.num_draft_tokens > 0:
            self.draft = BatchDecodeWithPagedKVCacheWrapper(
                ThreadState.draft_workspace(), "NHD", backend="trtllm-gen"
            )
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def record_plan(self, kind: str, bs: int, max_kv_len: int) -> None:
        """Remember what each wrapper was last planned for (the stats endpoint reports it)."""
        self._plan_info[kind] = (bs, max_kv_len)  # ok: FC103

    def planned(self, kind: str) -> Tuple[int, int]:
        return self._plan_info.get(kind, (0, 0))

    def enable_graphs(self) -> None:
        self._use_cuda_graph = True

    def graph_ready(self, bs: int) -> bool:
        return self._use_cuda_graph and bs in self.graph_decode  # ok: FC103

    @property
    def backend_name(self) -> str:
        return self._backend


class WrapperCache:
    """Class-level cache of the bigger wrappers, one per (thread, kind)."""

    _WRAPPERS: ClassVar[Dict[Tuple[int, str], Any]] = {}
    _KINDS: ClassVar[FrozenSet[str]] = frozenset({"ragged", "paged", "softcap"})
    _PRIVATE_WS: ClassVar[Tuple[str, ...]] = ("_float_workspace_buffer", "_int_workspace_buffer")
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @staticmethod
    def _key(kind: str) -> Tuple[int, str]:
        assert kind in WrapperCache._KINDS, kind  # ok: FC109
        return (threading.get_ident(), kind)

    @classmethod
    def _lookup(cls, key: Tuple[int, str]) -> Any:
        with cls._lock:
            return cls._WRAPPERS.get(key)

    @classmethod
    def _store(cls, key: Tuple[int, str], wrapper: Any) -> Any:
        with cls._lock:
            return cls._WRAPPERS.setdefault(key, wrapper)

    @classmethod
    def ragged_prefill(cls) -> BatchPrefillWithRaggedKVCacheWrapper:
        key = cls._key("ragged")
        w = cls._lookup(key)
        if w is None:
            ws = WorkspaceManager().ragged_workspace(ThreadState.device())
            w = cls._store(key, BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa2"))
        return w

    @classmethod
    def paged_prefill(cls) -> BatchPrefillWithPagedKVCacheWrapper:
        key = cls._key("paged")
        w = cls._lookup(key)
        if w is None:
            ws = WorkspaceManager().prefill_workspace(ThreadState.device())
            w = cls._store(key, BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2"))
        return w

    @classmethod
    def softcap_decode(cls) -> BatchDecodeWithPagedKVCacheWrapper:
        """Decode for the soft-capped layers: the cap is a plan() argument, so it needs a wrapper of its own."""
        key = cls._key("softcap")
        w = cls._lookup(key)
        if w is None:
            ws = WorkspaceManager().decode_workspace(ThreadState.device(), kind="softcap")
            w = cls._store(key, BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True, backend="fa2"))
        return w

    @classmethod
    def workspace_bytes(cls) -> int:
        """Bytes of workspace held by the cached wrappers of every thread (memory report)."""
        total = 0
        with cls._lock:
            wrappers = list(cls._WRAPPERS.values())
        for w in wrappers:
            for name in cls._PRIVATE_WS:
                buf = getattr(w, name, None)  # expect: FC103
                if buf is not None:
                    total += buf.numel() * buf.element_size()
        return total

    @classmethod
    def drop_thread(cls, tid: int) -> int:
        with cls._lock:
            keys = [k for k in cls._WRAPPERS if k[0] == tid]
            for k in keys:
                del cls._WRAPPERS[k]
        return len(keys)
