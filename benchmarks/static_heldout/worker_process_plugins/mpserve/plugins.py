"""Attention backends: entry points in the ``mpserve.attention_backends`` group,
then the built-in table (the fallback when no plugin of that name is installed)."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Dict, Optional, Type

import torch

from .backends.base import AttentionBackend
from .backends.flashinfer_backend import FlashInferBackend
from .backends.trtllm_backend import TrtllmDecodeBackend
from .config import ENTRY_POINT_GROUP, EngineConfig

logger = logging.getLogger(__name__)

_BUILTIN_BACKENDS: Dict[str, Type[AttentionBackend]] = {
    "flashinfer": FlashInferBackend,
    "trtllm": TrtllmDecodeBackend,
}
_LOADED: Dict[str, Type[AttentionBackend]] = {}


def register_backend(name: str, cls: Type[AttentionBackend]) -> None:
    """Register a backend class in-process (tests, notebooks)."""
    assert name not in _BUILTIN_BACKENDS, f"{name} would shadow a built-in backend"  # expect: FC109
    _LOADED[name] = cls


def discover_entry_points() -> Dict[str, EntryPoint]:
    found: Dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            logger.warning("backend %s provided twice (%s, %s); keeping the first", ep.name, found[ep.name].value, ep.value)
            continue
        found[ep.name] = ep
    return found


def _load_plugin(name: str) -> Optional[Type[AttentionBackend]]:
    ep = discover_entry_points().get(name)
    if ep is None:
        return None
    try:
        obj = ep.load()
    except Exception as exc:  # a broken plugin must not take the worker down
        logger.error("failed to load attention backend %s from %s: %s", name, ep.value, exc)
        return None
    if not (isinstance(obj, type) and issubclass(obj, AttentionBackend)):
        raise TypeError(f"entry point {ep.value} is not an AttentionBackend subclass")
    return obj


def resolve_backend_class(name: str) -> Type[AttentionBackend]:
    cls = _LOADED.get(name)
    if cls is None:
        cls = _load_plugin(name)
        if cls is not None:
            _LOADED[name] = cls
    if cls is None:
        cls = _BUILTIN_BACKENDS.get(name)
    if cls is None:
        known = sorted(set(_BUILTIN_BACKENDS) | set(discover_entry_points()))
        raise KeyError(f"unknown attention backend {name!r}; known: {known}")
    return cls


def create_backend(cfg: EngineConfig, device: torch.device) -> AttentionBackend:
    cls = resolve_backend_class(cfg.attn_backend)
    return cls(cfg, device)
