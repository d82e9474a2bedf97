"""`BatchSpec`: one batch as a scheduler sees it, host-side numbers only.

Cheap to build, immutable, validated on construction (every error names the field and the value), and
round-trips through JSON so that fuzzers can save and shrink it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

import numpy as np

from flashcheck.errors import InvalidArgument

__all__ = ["BatchSpec", "DType"]

DType = Literal["float16", "bfloat16", "float8_e4m3fn", "float32"]
_DTYPES: tuple[str, ...] = get_args(DType)
_MAX_TOKENS = 1 << 24  # int32 indptr arithmetic stays far from overflow below this


@dataclass(frozen=True)
class BatchSpec:
    """One batch of attention requests.

    Attributes:
        qo_lens: query (new-token) length of every request; ``1`` for a decode request.
        kv_lens: key/value length of every request, the new tokens included, so ``kv_len >= qo_len``.
        page_size: tokens per KV-cache page (1 for SGLang-style token pools).
        num_qo_heads, num_kv_heads: query and KV heads; ``num_qo_heads % num_kv_heads == 0`` (GQA/MQA).
        head_dim_qk, head_dim_vo: head dimensions; they differ for MLA (``576 = 512 + 64`` vs ``512``).
        q_dtype, kv_dtype: element types of queries and of the KV cache.
        causal: causal mask inside each request (bottom-right aligned when ``kv_len > qo_len``).
        window_left: sliding window (keys ``j >= i - window_left`` are visible); ``-1`` means none.
        logits_soft_cap: ``cap * tanh(logits / cap)`` when > 0; 0 means off.
        sm_scale: softmax scale; None means ``1 / sqrt(head_dim_qk)``.
    """

    qo_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_size: int = 16
    num_qo_heads: int = 8
    num_kv_heads: int = 8
    head_dim_qk: int = 128
    head_dim_vo: int = 128
    q_dtype: DType = "float16"
    kv_dtype: DType = "float16"
    causal: bool = True
    window_left: int = -1
    logits_soft_cap: float = 0.0
    sm_scale: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "qo_lens", _int_tuple("qo_lens", self.qo_lens))
        object.__setattr__(self, "kv_lens", _int_tuple("kv_lens", self.kv_lens))
        _check(len(self.qo_lens) >= 1, "qo_lens", self.qo_lens, "needs at least one request")
        _check(
            len(self.qo_lens) == len(self.kv_lens),
            "kv_lens",
            self.kv_lens,
            f"must have one entry per request ({len(self.qo_lens)} in qo_lens, {len(self.kv_lens)} in kv_lens)",
        )
        for i, (q, k) in enumerate(zip(self.qo_lens, self.kv_lens, strict=True)):
            _check(q >= 1, f"qo_lens[{i}]", q, "must be >= 1 (padding rows come from the layout, not the spec)")
            _check(k >= q, f"kv_lens[{i}]", k, f"must be >= qo_lens[{i}]={q} (the KV includes the new tokens)")
        _check(sum(self.kv_lens) < _MAX_TOKENS, "kv_lens", f"sum={sum(self.kv_lens)}", f"must sum to < {_MAX_TOKENS}")
        for name in ("page_size", "num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo"):
            v = getattr(self, name)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v, "must be an int >= 1")
        _check(
            self.num_qo_heads % self.num_kv_heads == 0,
            "num_qo_heads",
            self.num_qo_heads,
            f"must be a multiple of num_kv_heads={self.num_kv_heads}",
        )
        for name in ("q_dtype", "kv_dtype"):
            v = getattr(self, name)
            _check(v in _DTYPES, name, v, f"must be one of {', '.join(_DTYPES)}")
        _check(isinstance(self.causal, bool), "causal", self.causal, "must be a bool")
        _check(
            isinstance(self.window_left, int) and self.window_left >= -1,
            "window_left",
            self.window_left,
            "must be -1 (no window) or >= 0",
        )
        _check(self.logits_soft_cap >= 0.0, "logits_soft_cap", self.logits_soft_cap, "must be >= 0 (0 = off)")
        if self.sm_scale is not None:
            _check(self.sm_scale > 0.0, "sm_scale", self.sm_scale, "must be > 0 or None")

    # ---- derived numbers -------------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def total_qo(self) -> int:
        return sum(self.qo_lens)

    @property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @property
    def scale(self) -> float:
        return self.sm_scale if self.sm_scale is not None else self.head_dim_qk**-0.5

    def pages_per_request(self) -> tuple[int, ...]:
        return tuple(-(-k // self.page_size) for k in self.kv_lens)

    @property
    def num_pages_needed(self) -> int:
        return sum(self.pages_per_request())

    def with_lengths(self, qo_lens: Sequence[int], kv_lens: Sequence[int]) -> BatchSpec:
        """The same configuration with other requests (used by shrinking and by replay sequences)."""
        return replace(self, qo_lens=tuple(qo_lens), kv_lens=tuple(kv_lens))  # validated by __post_init__

    # ---- JSON ------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["qo_lens"], d["kv_lens"] = list(self.qo_lens), list(self.kv_lens)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchSpec:
        if not isinstance(d, Mapping):
            raise InvalidArgument(f"a BatchSpec must be a JSON object, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InvalidArgument(f"unknown BatchSpec field(s) {unknown}; known fields: {sorted(names)}")
        missing = [n for n in ("qo_lens", "kv_lens") if n not in d]
        if missing:
            raise InvalidArgument(f"BatchSpec is missing required field(s) {missing}")
        kw = dict(d)
        kw["qo_lens"], kw["kv_lens"] = tuple(d["qo_lens"]), tuple(d["kv_lens"])
        return cls(**kw)

    def __repr__(self) -> str:
        def short(xs: tuple[int, ...]) -> str:
            return str(list(xs)) if len(xs) <= 8 else f"[{', '.join(map(str, xs[:6]))}, ... ({len(xs)} total)]"

        return (
            f"BatchSpec(bs={self.batch_size}, qo_lens={short(self.qo_lens)}, kv_lens={short(self.kv_lens)}, "
            f"page_size={self.page_size}, heads={self.num_qo_heads}/{self.num_kv_heads}, "
            f"dims={self.head_dim_qk}/{self.head_dim_vo}, {self.q_dtype}/{self.kv_dtype}, causal={self.causal}, "
            f"window_left={self.window_left}, soft_cap={self.logits_soft_cap})"
        )


def _int_tuple(name: str, xs: object) -> tuple[int, ...]:
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise InvalidArgument(f"BatchSpec.{name} must be a sequence of ints, got {xs!r:.80}")
    out: list[int] = []
    for i, x in enumerate(xs):
        if isinstance(x, bool) or not isinstance(x, int):
            if isinstance(x, np.integer):
                out.append(int(x))
                continue
            raise InvalidArgument(f"BatchSpec.{name}[{i}] must be an int, got {x!r} ({type(x).__name__})")
        out.append(x)
    return tuple(out)


def _check(ok: bool, field_name: str, value: object, rule: str) -> None:
    if not ok:
        raise InvalidArgument(f"BatchSpec.{field_name}={value!r:.120} {rule}")
