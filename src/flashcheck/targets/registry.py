"""Built-in targets by name: ``make_target("decode-tc", buckets=(1, 2, 4))``; user targets as ``module:ClassName``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from flashcheck.errors import InvalidArgument
from flashcheck.targets.protocol import Target, check_target

__all__ = ["BUILTIN_TARGETS", "GPU_TARGETS", "make_target", "resolve_target"]


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


def resolve_target(name: str) -> Callable[..., Target]:
    """The factory of a built-in target, or of a user target given as ``module:ClassName`` (or
    ``module:function``): the module is imported from ``sys.path`` and the attribute is called with the
    configuration. Unknown names raise `InvalidArgument`."""
    if name in BUILTIN_TARGETS:
        return BUILTIN_TARGETS[name]
    if ":" not in name:
        raise InvalidArgument(
            f"unknown target {name!r}; built-in targets: {', '.join(BUILTIN_TARGETS)}, or module:ClassName"
        )
    module, _, attr = name.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise InvalidArgument(f"target {name!r}: cannot import module {module!r} ({exc}); is it on sys.path?") from exc
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise InvalidArgument(f"target {name!r}: module {module!r} has no class or function {attr!r}")
    return factory  # type: ignore[no-any-return]


def make_target(name: str, **config: Any) -> Target:
    """Build a built-in target (or ``module:ClassName``); `config` overrides its defaults (buckets, padding...)."""
    factory = resolve_target(name)
    try:
        return check_target(factory(**config))
    except TypeError as exc:
        raise InvalidArgument(f"bad configuration for target {name!r}: {exc}") from exc
