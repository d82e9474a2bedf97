"""Targets by name: ``make_target("decode-tc", buckets=(1, 2, 4))``, or a user's own as ``"package.module:Class"``.

A spec with a colon names an importable class (or factory) and is how reproducers of custom targets re-create them in
a fresh process: ``make_target("mypkg.backend:MyTarget", **config)`` imports ``mypkg.backend`` and calls
``MyTarget(**config)``. `make_target` also accepts what a target's ``config()`` returned (a template as a dict,
buckets as a list, keys the factory fixes itself), so ``make_target(t.name, **t.config())`` rebuilds ``t``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from flashcheck.errors import InvalidArgument
from flashcheck.targets.protocol import Target, check_target

__all__ = ["BUILTIN_TARGETS", "GPU_TARGETS", "make_target", "resolve_target", "target_spec"]


def _reference(**kw: Any) -> Target:
    from flashcheck.targets.reference import ReferenceTarget

    return ReferenceTarget(**kw)


def _decode(tc: bool) -> Callable[..., Target]:
    def make(**kw: Any) -> Target:
        from flashcheck.targets.flashinfer.decode import DecodeTarget

        return DecodeTarget(use_tensor_cores=tc, **kw)

    return make


def _prefill(backend: str, ragged: bool) -> Callable[..., Target]:
    def make(**kw: Any) -> Target:
        from flashcheck.targets.flashinfer.prefill import PagedPrefillTarget, RaggedPrefillTarget

        if ragged:
            return RaggedPrefillTarget(backend=backend, **kw)  # type: ignore[arg-type]
        kw.setdefault("buckets", (1, 2, 4, 8, 16))
        kw.setdefault("max_qo_len", 16)
        return PagedPrefillTarget(backend=backend, **kw)  # type: ignore[arg-type]

    return make


def _mla(backend: str) -> Callable[..., Target]:
    def make(**kw: Any) -> Target:
        from flashcheck.targets.flashinfer.mla import MLATarget

        kw.setdefault("max_qo_len", 4)
        return MLATarget(backend=backend, **kw)

    return make


def _batch_attention(**kw: Any) -> Target:
    from flashcheck.targets.flashinfer.holistic import BatchAttentionTarget

    return BatchAttentionTarget(**kw)


BUILTIN_TARGETS: dict[str, Callable[..., Target]] = {
    "cpu-reference": _reference,
    "decode-cuda": _decode(False),
    "decode-tc": _decode(True),
    "prefill-fa2": _prefill("fa2", ragged=False),
    "prefill-fa3": _prefill("fa3", ragged=False),
    "ragged-fa2": _prefill("fa2", ragged=True),
    "ragged-fa3": _prefill("fa3", ragged=True),
    "mla-fa2": _mla("fa2"),
    "mla-fa3": _mla("fa3"),
    "batch-attention": _batch_attention,
}
GPU_TARGETS: tuple[str, ...] = tuple(n for n in BUILTIN_TARGETS if n != "cpu-reference")


# keys a built-in factory sets itself: a recorded config() carries them, the factory must not receive them twice
_FIXED: dict[str, dict[str, Any]] = {
    "decode-cuda": {"use_tensor_cores": False, "max_qo_len": 1},
    "decode-tc": {"use_tensor_cores": True, "max_qo_len": 1},
    "prefill-fa2": {"backend": "fa2"},
    "prefill-fa3": {"backend": "fa3"},
    "ragged-fa2": {"backend": "fa2", "buckets": None},
    "ragged-fa3": {"backend": "fa3", "buckets": None},
    "mla-fa2": {"backend": "fa2"},
    "mla-fa3": {"backend": "fa3"},
    "batch-attention": {"buckets": None, "metadata": None},
}


def make_target(name: str, **config: Any) -> Target:
    """Build a target from a built-in name or a ``"module:Class"`` spec; `config` overrides its defaults.

    `config` may be a target's own ``config()`` output (see the module docstring).
    """
    factory = _factory(name)
    kw = _normalize(name, config)
    try:
        return check_target(factory(**kw))
    except TypeError as exc:
        raise InvalidArgument(f"bad configuration for target {name!r}: {exc}") from exc


def target_spec(target: Target) -> str:
    """The name that rebuilds `target` in a fresh process: its built-in name, else ``"module:QualifiedClass"``."""
    cls = type(target)
    if target.name in BUILTIN_TARGETS and cls.__module__.startswith("flashcheck.targets."):
        return target.name
    return f"{cls.__module__}:{cls.__qualname__}"


def _factory(name: str) -> Callable[..., Any]:
    if name in BUILTIN_TARGETS:
        return BUILTIN_TARGETS[name]
    if ":" not in name:
        raise InvalidArgument(
            f"unknown target {name!r}; built-in targets: {', '.join(BUILTIN_TARGETS)}, "
            "or 'package.module:Class' for your own"
        )
    module, _, qual = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise InvalidArgument(f"target {name!r}: cannot import module {module!r} ({exc}); is it on sys.path?") from exc
    for part in qual.split("."):
        if part == "<locals>" or not hasattr(obj, part):
            raise InvalidArgument(f"target {name!r}: {module!r} has no importable attribute {qual!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InvalidArgument(f"target {name!r}: {qual!r} is not a class or factory")
    return obj  # type: ignore[no-any-return]


def _normalize(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    from flashcheck.batch import BatchSpec

    kw = {k: v for k, v in config.items() if k != "kind"}
    for key, value in _FIXED.get(name, {}).items():
        if key in kw:
            given = kw.pop(key)
            if value is not None and given != value:
                raise InvalidArgument(f"target {name!r} has {key}={value!r}; the configuration says {given!r}")
    if isinstance(kw.get("template"), Mapping):
        kw["template"] = BatchSpec.from_dict(kw["template"])
    if isinstance(kw.get("buckets"), list):
        kw["buckets"] = tuple(kw["buckets"])
    return kw


def resolve_target(name: str) -> Callable[..., Target]:
    """The factory of a built-in target or of a ``module:ClassName`` spec (`InvalidArgument` when unknown)."""
    return _factory(name)
