"""The driver's fp32 reference on CUDA: batches padded to power-of-two shapes and recorded as CUDA graphs.

`paged_attention_torch` launches about forty kernels from Python per batch, most of a fuzz step's host time, and its
shapes change with every batch, so it cannot be replayed as it is. `GraphedReference` pads a batch to the next
power of two in requests, query rows per request and KV pages per request (the padding is masked, exactly as the
one-shot path masks its own), writes the batch's indices and queries into static buffers of that shape, and runs
the same `attend_padded` core through `GraphCache`: eagerly until a shape is seen twice, then by replaying its
graph. A decode target meets a few dozen shapes. Larger batches than the one-shot limit take the plain path; CPU
tensors take the padded path eagerly (how CI tests it). The GPU tests hold it to the numpy reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashcheck._cuda_graphs import GraphCache
from flashcheck.layout import PagedLayout
from flashcheck.reference import torch_ref

__all__ = ["GraphedReference"]

_MAX_GRAPHS = 256


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class GraphedReference:
    """``ref(q, layout)`` -> fp32 [rows, H, Dvo] over fixed caches. The result of a replayed graph is its static
    output: read it before the next call."""

    def __init__(self, k_cache: Any, v_cache: Any, *, max_graphs: int = _MAX_GRAPHS) -> None:
        import torch

        self.torch = torch
        self.k_cache, self.v_cache = k_cache, v_cache
        self.graphs = GraphCache(max_graphs)
        self._static: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def __call__(self, q: Any, layout: PagedLayout) -> Any:
        torch = self.torch
        spec = layout.spec
        b = layout.batch_size
        real = layout.real_qo_rows()
        qo = layout.qo_indptr[: b + 1].astype(np.int64)
        kv = layout.kv_indptr[: b + 1].astype(np.int64)
        q_lens, n_pages = np.diff(qo), np.diff(kv)
        if b == 0 or q.shape[0] != real:
            return torch_ref.paged_attention_torch(q, self.k_cache, self.v_cache, layout)
        bp, lqp, npp = _pow2(b), _pow2(int(q_lens.max())), _pow2(int(n_pages.max()))
        if bp * spec.num_qo_heads * lqp * npp * spec.page_size > torch_ref._BATCHED_ELEMENTS:
            return torch_ref.paged_attention_torch(q, self.k_cache, self.v_cache, layout)
        key = (
            bp,
            lqp,
            npp,
            q.dtype,
            tuple(q.shape[1:]),
            spec.page_size,
            spec.causal,
            spec.window_left,
            spec.logits_soft_cap,
            spec.scale,
        )
        static = self._static.get(key)
        if static is None:
            slots = bp * lqp
            ints = torch.zeros(bp * npp + 2 * bp + 2 * slots, dtype=torch.int64, device=q.device)
            q_in = torch.zeros((slots + 1, *q.shape[1:]), dtype=q.dtype, device=q.device)  # last row stays 0
            static = self._static[key] = (ints, q_in)
        ints, q_in = static
        page_ids, kv_lens, q_len_d, src_row, row_slot = torch_ref.to_device(
            torch, q.device, _host_indices(layout, b, bp, lqp, npp, q_lens, n_pages), out=ints
        )
        q_in[:real].copy_(q)

        def build() -> Any:
            qp = q_in.index_select(0, src_row).view(bp, lqp, *q.shape[1:])
            o = torch_ref.attend_padded(torch, qp, self.k_cache, self.v_cache, page_ids, kv_lens, q_len_d, spec)
            return o.reshape(bp * lqp, *o.shape[2:]).index_select(0, row_slot)

        out = self.graphs.run(key, build) if q.device.type == "cuda" else build()  # CPU: the same path, eager
        return out[:real]


def _host_indices(layout: PagedLayout, b: int, bp: int, lqp: int, npp: int, q_lens: Any, n_pages: Any) -> list[Any]:
    """The padded batch's int inputs: page ids [bp * npp] (page 0 past a request's pages), kv and query lengths
    [bp] (0 for empty rows), the query row of each (request, position) slot [bp * lqp] (the zero row past a
    request's queries) and the slot of each real query row [bp * lqp] (0 past the real rows)."""
    kv_ptr = layout.kv_indptr[:b].astype(np.int64)
    cols = np.arange(npp)
    idx = np.clip(kv_ptr[:, None] + cols[None, :], 0, max(0, layout.kv_indices.size - 1))
    pages = np.zeros((bp, npp), dtype=np.int64)
    pages[:b] = np.where(cols[None, :] < n_pages[:, None], layout.kv_indices[idx], 0)
    kv_lens = np.zeros(bp, dtype=np.int64)
    kv_lens[:b] = layout.seq_lens[:b]
    ql = np.zeros(bp, dtype=np.int64)
    ql[:b] = q_lens
    slots = bp * lqp
    pos = np.arange(lqp)
    src = np.full((bp, lqp), slots, dtype=np.int64)  # the zero row
    src[:b] = np.where(pos[None, :] < q_lens[:, None], layout.qo_indptr[:b].astype(np.int64)[:, None] + pos, slots)
    req = np.repeat(np.arange(b), q_lens)
    off = np.arange(req.size) - layout.qo_indptr[:b].astype(np.int64)[req]
    row_slot = np.zeros(slots, dtype=np.int64)
    row_slot[: req.size] = req * lqp + off
    return [pages, kv_lens, ql, src, row_slot]
