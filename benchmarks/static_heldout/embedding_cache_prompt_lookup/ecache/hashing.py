"""Prompt keys: a hash of the token ids (and the adapter, if any) computed on the host."""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np


def prompt_hash(token_ids: Sequence[int], adapter: Optional[str] = None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    if adapter:
        h.update(adapter.encode())
        h.update(b"\x00")
    h.update(np.asarray(token_ids, dtype=np.int32).tobytes())
    return h.digest()
