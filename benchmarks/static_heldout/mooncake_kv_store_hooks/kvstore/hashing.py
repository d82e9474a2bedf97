"""Chained page hashes: the key of page ``i`` covers every token up to the end of that page."""

from __future__ import annotations

import hashlib
from typing import List, Sequence

import numpy as np


def page_hashes(token_ids: Sequence[int], page_size: int, salt: bytes = b"") -> List[bytes]:
    arr = np.asarray(token_ids, dtype=np.int64)
    out: List[bytes] = []
    prev = salt
    for i in range(arr.size // page_size):
        chunk = arr[i * page_size : (i + 1) * page_size]
        prev = hashlib.blake2b(prev + chunk.tobytes(), digest_size=16).digest()
        out.append(prev)
    return out


def hex_keys(hashes: Sequence[bytes], model_id: str) -> List[str]:
    return [f"{model_id}/{h.hex()}" for h in hashes]
