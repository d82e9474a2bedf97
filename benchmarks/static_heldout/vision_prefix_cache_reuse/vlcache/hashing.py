"""Content hashes of preprocessed images (the cache key of their encoder outputs and KV)."""
from __future__ import annotations

import hashlib
from typing import Tuple

_HEX = frozenset("0123456789abcdef")

# Pages of the null image hold one tile of zeros; graph capture points its dummy rows at them.
NULL_IMAGE_HASH = "0" * 64


def image_hash(pixels: bytes, size: Tuple[int, int], processor_rev: str = "qwen2vl-v1") -> str:
    h = hashlib.sha256()
    h.update(processor_rev.encode())
    h.update(f"{size[0]}x{size[1]}".encode())
    h.update(pixels)
    return h.hexdigest()


def _check_hash(h: str) -> str:
    assert len(h) == 64 and set(h) <= _HEX  # expect: FC109
    return h
