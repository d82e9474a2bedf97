"""Dense fallback: when every row fits under its window, sparse attention is plain attention."""
from __future__ import annotations

from typing import Optional

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache as trt_decode

_DENSE_WS: Optional[torch.Tensor] = None


def init_dense_workspace(nbytes: int, device: torch.device) -> None:
    global _DENSE_WS
    if _DENSE_WS is None:
        _DENSE_WS = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def dense_decode(
    q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    return trt_decode(q, kv_cache, _DENSE_WS, block_tables, seq_lens, max_len, scale, 1.0)
