"""Named length distributions of serving batches, generated in bulk with numpy (never per element).

Hypothesis draws the *parameters* (distribution, batch size, seed); these functions turn them into arrays, so
generation costs microseconds per batch instead of milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from flashcheck.errors import InvalidArgument

__all__ = ["DISTRIBUTIONS", "PRODUCTION_MIX", "Distribution", "sample_lengths"]

Distribution = Literal["uniform", "decode_heavy", "chunked_prefill", "spec_decode", "production", "page_boundary"]
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)
I64 = npt.NDArray[np.int64]

# the production mix of FlashInfer #3379: kv lengths 4k..128k with weights 35/20/15/12/10/8 (%)
PRODUCTION_MIX: tuple[tuple[int, int, float], ...] = (
    (4096, 8192, 0.35),
    (8192, 16384, 0.20),
    (16384, 32768, 0.15),
    (32768, 65536, 0.12),
    (65536, 98304, 0.10),
    (98304, 131072, 0.08),
)


_CHUNKS = (64, 128, 256, 512)  # chunked prefill's chunk sizes
_MIX_LO = np.array([b[0] for b in PRODUCTION_MIX])
_MIX_HI = np.array([b[1] for b in PRODUCTION_MIX])
_MIX_W = np.array([b[2] for b in PRODUCTION_MIX])
_MIX_P = _MIX_W / _MIX_W.sum()


def sample_lengths(
    dist: str, batch_size: int, seed: int, *, max_kv: int = 4096, page_size: int = 16
) -> tuple[I64, I64]:
    """Return ``(qo_lens, kv_lens)`` of `batch_size` requests drawn from the named distribution.

    `max_kv` caps kv lengths (targets have finite caches); the production mix is scaled down to it when its
    4k..128k range does not fit, keeping its shape.
    """
    if batch_size < 1:
        raise InvalidArgument(f"batch_size must be >= 1, got {batch_size}")
    if max_kv < 8:
        raise InvalidArgument(f"max_kv must be >= 8, got {max_kv}")
    try:
        fn = _GENERATORS[dist]
    except KeyError:
        raise InvalidArgument(f"unknown distribution {dist!r}; choose one of {', '.join(DISTRIBUTIONS)}") from None
    rng = np.random.default_rng(seed)
    qo, kv = fn(rng, batch_size, max_kv, page_size)
    kv = np.minimum(np.maximum(kv, 1), max_kv)  # np.clip's values, without its Python-level overhead
    qo = np.minimum(np.maximum(qo, 1), kv)
    return qo.astype(np.int64), kv.astype(np.int64)


def _uniform(rng: np.random.Generator, n: int, max_kv: int, page: int) -> tuple[I64, I64]:
    kv = rng.integers(1, max_kv + 1, n)
    qo = rng.integers(1, np.minimum(kv, 64) + 1)
    return qo, kv


def _decode_heavy(rng: np.random.Generator, n: int, max_kv: int, page: int) -> tuple[I64, I64]:
    kv = rng.integers(1, max_kv + 1, n)
    qo = np.where(rng.random(n) < 0.9, 1, rng.integers(1, np.minimum(kv, 256) + 1))
    return qo, kv


def _chunked_prefill(rng: np.random.Generator, n: int, max_kv: int, page: int) -> tuple[I64, I64]:
    chunk = _CHUNKS[int(rng.integers(0, len(_CHUNKS)))]  # the draw of rng.choice(_CHUNKS), without an array
    kv = rng.integers(1, max_kv + 1, n)
    qo = np.minimum(kv, chunk)
    return qo, kv


def _spec_decode(rng: np.random.Generator, n: int, max_kv: int, page: int) -> tuple[I64, I64]:
    qo = rng.integers(2, 9, n)
    kv = rng.integers(8, max_kv + 1, n)
    return qo, kv


def _production(rng: np.random.Generator, n: int, max_kv: int, page: int) -> tuple[I64, I64]:
    scale = min(1.0, max_kv / float(_MIX_HI[-1]))
    bucket = rng.choice(len(_MIX_W), size=n, p=_MIX_P)
    kv = (rng.integers(_MIX_LO[bucket], _MIX_HI[bucket]) * scale).astype(np.int64)
    return np.ones(n, dtype=np.int64), np.maximum(kv, 1)


def _page_boundary(rng: np.random.Generator, n: int, max_kv: int, page: int) -> tuple[I64, I64]:
    k = rng.integers(1, max(2, max_kv // page) + 1, n)
    kv = k * page + rng.integers(-1, 2, n)
    kv = np.where(rng.random(n) < 0.15, 1, kv)  # single tokens
    qo = np.where(rng.random(n) < 0.7, 1, rng.integers(1, np.maximum(kv, 1) + 1))
    return qo, kv


_GENERATORS: dict[str, Callable[[np.random.Generator, int, int, int], tuple[I64, I64]]] = {
    "uniform": _uniform,
    "decode_heavy": _decode_heavy,
    "chunked_prefill": _chunked_prefill,
    "spec_decode": _spec_decode,
    "production": _production,
    "page_boundary": _page_boundary,
}
