"""Generic movers over nested containers of tensors (namespace package, no __init__.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten


def move(obj: Any, device, non_blocking: bool = False) -> Any:
    """Recursively move the tensors of dicts, lists, tuples, NamedTuples and dataclasses to ``device``.

    Dataclass fields tagged ``metadata={"host": True}`` are host mirrors and are left in place.
    """
    assert not isinstance(obj, torch.nn.Module), "move() is for records, use Module.to()"  # expect: FC109
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)  # ok: FC101
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: move(getattr(obj, f.name), device, non_blocking)
            for f in dataclasses.fields(obj)
            if f.init and not f.metadata.get("host", False)
        }
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(move(v, device, non_blocking) for v in obj))
    if isinstance(obj, tuple):
        return tuple(move(v, device, non_blocking) for v in obj)
    if isinstance(obj, list):
        return [move(v, device, non_blocking) for v in obj]
    if isinstance(obj, dict):
        return {k: move(v, device, non_blocking) for k, v in obj.items()}
    return obj


def to_host(tree: Any) -> Any:
    """Blocking copy of every tensor leaf of a pytree to host memory."""
    return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, tree)  # expect: FC101


def pin_tree(tree: Any) -> Any:
    return tree_map(lambda t: t.pin_memory() if isinstance(t, torch.Tensor) else t, tree)


def stage_tree(host_tree: Any, device) -> Any:
    """Upload a pinned pytree without blocking the host."""
    _check_pinned(host_tree)
    return tree_map(lambda t: t.to(device, non_blocking=True), host_tree)


def _check_pinned(tree: Any) -> None:
    leaves, _ = tree_flatten(tree)
    for leaf in leaves:
        assert not isinstance(leaf, torch.Tensor) or leaf.is_pinned()  # expect: FC109


def tree_nbytes(tree: Any) -> int:
    leaves, _ = tree_flatten(tree)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def split_tree(tree: Any, n: int) -> Any:
    """First ``n`` rows of every tensor leaf (views, no copies)."""
    leaves, spec = tree_flatten(tree)
    cut: List[Any] = [t[:n] if isinstance(t, torch.Tensor) else t for t in leaves]
    return tree_unflatten(cut, spec)


def describe(tree: Any) -> Dict[str, Any]:
    leaves, spec = tree_flatten(tree)
    return {"num_leaves": len(leaves), "spec": str(spec)}
