"""Graph buckets per (batch size, active adapter count) and the serving step."""
from __future__ import annotations

import itertools
import logging
from functools import partial
from typing import Callable, Sequence

import numpy as np
import torch

from .adapters import AdapterSlots, AdapterWeights
from .attn import AttnDims, LoraAttnBackend, LoraBatch
from .constants import MAX_LORAS
from .registry import get_lora_backend

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 4, 8, 16, 32, 64)
ADAPTER_BUCKETS = (1, 2, 4, 8)


def _round_up(x: int, buckets: Sequence[int]) -> int:
    return next(b for b in buckets if b >= x)


class LoraGraphRunner:
    def __init__(self, backend: LoraAttnBackend, dims: AttnDims) -> None:
        self.backend = backend
        self.dims = dims
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._fixed_batch_size = max(BATCH_BUCKETS)  # ok: FC103
        self.q = torch.zeros(dims.max_bs, dims.num_qo_heads, dims.head_dim, dtype=torch.float16, device="cuda")
        self.out = torch.zeros_like(self.q)
        self.kv_cache = torch.zeros(dims.max_pages, 2, dims.page_size, dims.num_kv_heads, dims.head_dim,
                                    dtype=torch.float16, device="cuda")
        self.prefix_k = torch.zeros(64, dims.num_kv_heads, dims.head_dim, dtype=torch.float16, device="cuda")

    def capture_buckets(self, max_adapters: int) -> None:
        assert max_adapters <= MAX_LORAS  # expect: FC109
        if self._fixed_batch_size > self.dims.max_bs:
            raise ValueError("largest batch bucket exceeds max_bs")
        for bs, na in itertools.product(reversed(BATCH_BUCKETS), ADAPTER_BUCKETS):
            if na > min(bs, max_adapters):
                continue
            self.backend.add_bucket(bs, na)
            torch.cuda.current_stream().synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.out[:bs] = self.backend.forward_bucket(self.q[:bs], self.kv_cache, bs, na)
                for slot in range(na):
                    self.out[:bs] += self.backend.forward_adapter_prefix(
                        self.q[:bs], self.prefix_k, self.prefix_k, slot)
            self.graphs[(bs, na)] = g


class LoraEngine:
    def __init__(self, dims: AttnDims, hidden: int, backend_name: str = "flashinfer") -> None:
        self.device = torch.device("cuda")
        backend_cls = get_lora_backend(backend_name)
        self.backend: LoraAttnBackend = backend_cls(dims, self.device)
        self.slots = AdapterSlots(MAX_LORAS, hidden, self.device)
        self.runner = LoraGraphRunner(self.backend, dims)
        self._pick = partial(_round_up, buckets=BATCH_BUCKETS)

    def step(self, adapter_ids: list[int], new_adapters: list[AdapterWeights], kv_indptr_np: np.ndarray,
             kv_indices: torch.Tensor, last_page_len_np: np.ndarray) -> torch.Tensor:
        for w in new_adapters:
            self.slots.activate(len(self.slots.slot_of) % MAX_LORAS, w)
        ids_np = np.asarray([self.slots.slot_of[a] for a in adapter_ids], dtype=np.int64)
        batch = LoraBatch(
            num_reqs=len(adapter_ids),
            adapter_ids=torch.from_numpy(ids_np).to(self.device, non_blocking=True),
            adapter_ids_np=ids_np,
            kv_indptr_np=kv_indptr_np,
            kv_indices=kv_indices,
            last_page_len_np=last_page_len_np,
        )
        num_active = self.backend.update_for_step(batch)
        bs = self._pick(batch.num_reqs)
        na = _round_up(num_active, ADAPTER_BUCKETS)
        self.backend.prepare_bucket(bs, na, batch)
        seg = self.backend.lora_segments(batch.adapter_ids, MAX_LORAS)
        self.runner.graphs[(bs, na)].replay()
        return self.runner.out[: batch.num_reqs], seg
