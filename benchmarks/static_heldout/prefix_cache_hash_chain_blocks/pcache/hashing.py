"""Chained content hashes of full KV blocks, computed on the host (block i covers block i-1)."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence


@dataclass(frozen=True)
class BlockHash:
    value: bytes
    num_tokens: int


def hash_block_tokens(parent: Optional[BlockHash], token_ids: Sequence[int], extra: str = "") -> BlockHash:
    h = hashlib.sha256(parent.value if parent is not None else b"\x00" * 32)
    h.update(struct.pack(f"<{len(token_ids)}i", *token_ids))
    h.update(extra.encode())  # LoRA name or multimodal hash: same tokens, different KV
    return BlockHash(h.digest(), len(token_ids))


def hash_request_blocks(token_ids: Sequence[int], block_size: int, extra: str = "") -> List[BlockHash]:
    assert block_size > 0, "block_size must be positive"  # expect: FC109
    out: List[BlockHash] = []
    for i in range(len(token_ids) // block_size):
        out.append(hash_block_tokens(out[-1] if out else None, token_ids[i * block_size : (i + 1) * block_size], extra))
    return out

