"""Loose per-step records.

A step is not an object of a metadata class: it is a ``types.SimpleNamespace`` built from keyword
fields, extended in place as it moves through the engine (``update_record``, ``apply_fields``) and
unpacked back into calls with ``**vars(rec)``.  Backends, the graph runner and the sampler each add
the fields they need without a shared class hierarchy.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterable, Mapping

# Fields every step record carries from the moment it is built.
CORE_FIELDS = ("mode", "batch_size", "num_tokens")

# Slots the attention backends fill while planning.
META_SLOTS = {"wrapper": None, "window_wrapper": None, "plan_info": None}


def make_record(**fields: Any) -> SimpleNamespace:
    """Build a step record from keyword fields (``mode`` is required)."""
    assert "mode" in fields, "a step record needs a mode"  # expect: FC109
    fields.setdefault("batch_size", 0)
    fields.setdefault("num_tokens", 0)
    return SimpleNamespace(**fields)


def make_meta(**rec: Any) -> SimpleNamespace:
    """Attention metadata: a copy of a step record plus the planning slots."""
    for key, default in META_SLOTS.items():
        rec.setdefault(key, default)
    return SimpleNamespace(**rec)


def update_record(ns: SimpleNamespace, **updates: Any) -> SimpleNamespace:
    ns.__dict__.update(updates)
    return ns


def apply_fields(ns: SimpleNamespace, fields: Mapping[str, Any]) -> SimpleNamespace:
    for key, value in fields.items():
        setattr(ns, key, value)
    return ns


def copy_record(ns: SimpleNamespace, **changes: Any) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(ns), **changes})


def as_kwargs(ns: SimpleNamespace, keep: Iterable[str] | None = None, drop: Iterable[str] = ()) -> dict[str, Any]:
    out = dict(vars(ns))
    if keep is not None:
        wanted = set(keep)
        out = {k: v for k, v in out.items() if k in wanted}
    for name in drop:
        out.pop(name, None)
    return out


def pick(ns: SimpleNamespace, *names: str) -> dict[str, Any]:
    return {name: getattr(ns, name) for name in names}


def missing_fields(ns: SimpleNamespace, names: Iterable[str]) -> list[str]:
    present = vars(ns)
    return [n for n in names if n not in present]


def require(ns: SimpleNamespace, *names: str) -> SimpleNamespace:
    missing = missing_fields(ns, names or CORE_FIELDS)
    if missing:
        raise KeyError(f"record lacks fields {missing}; has {sorted(vars(ns))}")
    return ns
