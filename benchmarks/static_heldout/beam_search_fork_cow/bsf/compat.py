"""Additions to FlashInfer's graph decode wrapper that the engine needs before a release provides them."""
from __future__ import annotations

import torch
from flashinfer import CUDAGraphBatchDecodeWithPagedKVCacheWrapper


def _rebind_indices(self, indices_buffer: torch.Tensor) -> None:
    """Point a graph wrapper at a larger indices buffer after the page pool grew (before any capture)."""
    self._paged_kv_indices_buf = indices_buffer  # expect: FC103


CUDAGraphBatchDecodeWithPagedKVCacheWrapper.rebind_indices = _rebind_indices
