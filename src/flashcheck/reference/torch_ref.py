"""fp32 reference attention in torch, on any device (the GPU oracle; same math as `reference.attention`).

Used by the driver so that checking a GPU step does not copy the KV cache to the host. Tests pin it to the numpy
reference on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashcheck.batch import BatchSpec
from flashcheck.layout import PagedLayout

__all__ = ["paged_attention_torch"]


def paged_attention_torch(
    q: Any, k_cache: Any, v_cache: Any, layout: PagedLayout, spec: BatchSpec | None = None
) -> Any:
    """[rows, H, Dqk] queries over NHD caches [P, page, KH, D] -> fp32 [rows, H, Dvo]; padded rows stay 0.

    Real rows only are computed: ``rows`` may be ``layout.real_qo_rows()``.
    """
    import torch

    spec = spec or layout.spec
    dev = q.device
    rows = q.shape[0]
    out = torch.zeros((rows, spec.num_qo_heads, v_cache.shape[-1]), dtype=torch.float32, device=dev)
    g = spec.num_qo_heads // k_cache.shape[2]
    page = spec.page_size
    qo, kv, last = layout.qo_indptr, layout.kv_indptr, layout.kv_last_page_len
    b = layout.batch_size
    qo_lens = np.diff(qo[: b + 1]).astype(np.int64)
    real = int(qo[b])
    req = np.repeat(np.arange(b), qo_lens)  # query row -> its request, and its index inside the request
    off = np.arange(real) - qo[:b].astype(np.int64)[req]
    indices, kv_lens, pages, q_lens, req_d, off_d = _to_device(
        torch, dev, [layout.kv_indices, layout.seq_lens[:b], kv[: b + 1], qo_lens, req, off]
    )
    longest_q = int(qo_lens.max()) if b else 0
    padded_kv = -(-int(layout.seq_lens[:b].max()) // page) * page if b else 0
    if b and b * spec.num_qo_heads * longest_q * padded_kv <= _BATCHED_ELEMENTS:
        out[:real] = _batched(torch, q[:real], k_cache, v_cache, spec, longest_q, indices, kv_lens, pages, q_lens,
                              (req_d, off_d))
        return out
    for i in range(layout.batch_size):
        q0, q1 = int(qo[i]), int(qo[i + 1])
        p0, p1 = int(kv[i]), int(kv[i + 1])
        n = (p1 - p0 - 1) * page + int(last[i])
        ids = indices[p0:p1]
        k = k_cache[ids].reshape(-1, *k_cache.shape[2:])[:n].float()
        v = v_cache[ids].reshape(-1, *v_cache.shape[2:])[:n].float()
        if g > 1:
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
        qi = q[q0:q1].float()
        logits = torch.einsum("lhd,shd->hls", qi, k) * spec.scale
        if spec.logits_soft_cap > 0:
            logits = spec.logits_soft_cap * torch.tanh(logits / spec.logits_soft_cap)
        length = q1 - q0
        pos = (n - length + torch.arange(length, device=dev))[:, None]
        key = torch.arange(n, device=dev)[None, :]
        visible = torch.ones((length, n), dtype=torch.bool, device=dev)
        if spec.causal:
            visible &= key <= pos
        if spec.window_left >= 0:
            visible &= key >= pos - spec.window_left
        logits = logits.masked_fill(~visible[None], float("-inf"))
        p = torch.softmax(logits, dim=-1).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hls,shd->lhd", p, v)
    return out


_BATCHED_ELEMENTS = 1 << 26  # logits of the one-shot path (fp32): 256 MiB; larger batches go request by request


def _batched(
    torch: Any,
    q: Any,
    k_cache: Any,
    v_cache: Any,
    spec: BatchSpec,
    longest_q: int,
    indices: Any,
    kv_lens: Any,
    pages: Any,
    q_lens: Any,
    rows: tuple[Any, Any],
) -> Any:
    """Every request at once: queries padded to the longest request's, KV to the longest request's whole pages,
    the causal / window / length masks applied per request, two batched matmuls. [real rows, H, Dvo]."""
    dev = q.device
    b = kv_lens.numel()
    page = spec.page_size
    n_pages = -(-int(kv_lens.max()) // page)
    s = n_pages * page
    slot = pages[:-1, None] + torch.arange(n_pages, device=dev)[None, :]  # [b, pages] index into kv_indices
    page_ids = indices[slot.clamp(max=indices.numel() - 1)].reshape(-1)
    # whole pages are gathered (contiguous rows of the cache: a copy, not a per-token index); padding masked below
    k = k_cache.index_select(0, page_ids).view(b, s, *k_cache.shape[2:])  # [b, s, KH, D]
    v = v_cache.index_select(0, page_ids).view(b, s, *v_cache.shape[2:])
    kh = k.shape[2]
    g = spec.num_qo_heads // kh
    # fp32 copies made straight into the layouts the batched matmuls read (one copy each)
    kt = k.permute(0, 2, 3, 1).to(torch.float32, memory_format=torch.contiguous_format)  # [b, KH, D, s]
    vt = v.permute(0, 2, 1, 3).to(torch.float32, memory_format=torch.contiguous_format)  # [b, KH, s, Dvo]
    req, off = rows
    lq = longest_q
    qp = torch.zeros((b, lq, spec.num_qo_heads, q.shape[-1]), dtype=torch.float32, device=dev)
    qp[req, off] = q.float()
    qf = qp.view(b, lq, kh, g, -1).permute(0, 2, 3, 1, 4).reshape(b, kh, g * lq, -1)
    logits = torch.matmul(qf, kt).view(b, kh, g, lq, s) * spec.scale
    if spec.logits_soft_cap > 0:
        logits = spec.logits_soft_cap * torch.tanh(logits / spec.logits_soft_cap)
    key = torch.arange(s, device=dev)[None, None, :]
    pos = (kv_lens - q_lens)[:, None] + torch.arange(lq, device=dev)[None, :]  # [b, lq] position of each query
    visible = key < kv_lens[:, None, None]  # [b, 1 -> lq, s]
    if spec.causal:
        visible = visible & (key <= pos[:, :, None])
    if spec.window_left >= 0:
        visible = visible & (key >= pos[:, :, None] - spec.window_left)
    logits = logits.masked_fill(~visible[:, None, None], float("-inf"))
    p = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    o = torch.matmul(p.view(b, kh, g * lq, s), vt).view(b, kh, g, lq, -1)
    return o.permute(0, 3, 1, 2, 4).reshape(b, lq, spec.num_qo_heads, -1)[req, off]


class _Staging:
    """One pinned host buffer per device for the reference's small index copies, and the event of its last copy."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.done: Any = None


_STAGING: dict[str, _Staging] = {}


def _to_device(torch: Any, dev: Any, arrays: list[Any]) -> list[Any]:
    """int64 device copies of small host int arrays in one transfer. On CUDA it goes through a pinned buffer
    without a stream sync (a pageable copy waits for every kernel queued before it, three times per reference);
    the buffer is reused only after its previous copy has completed."""
    flat = [np.asarray(a, dtype=np.int64).reshape(-1) for a in arrays]
    if torch.device(dev).type != "cuda":
        return [torch.as_tensor(a, device=dev) for a in flat]
    n = sum(a.size for a in flat)
    st = _STAGING.get(str(dev))
    if st is None or st.buf.numel() < n:
        st = _STAGING[str(dev)] = _Staging(torch.empty(max(n, 1 << 14), dtype=torch.int64, pin_memory=True))
    elif st.done is not None:
        st.done.synchronize()
    host = st.buf[:n]
    host.numpy()[:] = np.concatenate(flat) if flat else []
    on_dev = host.to(dev, non_blocking=True)
    st.done = torch.cuda.Event()
    st.done.record()
    out, at = [], 0
    for a in flat:
        out.append(on_dev[at : at + a.size])
        at += a.size
    return out
