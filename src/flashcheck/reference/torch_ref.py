"""fp32 reference attention in torch, on any device (the GPU oracle; same math as `reference.attention`).

Used by the driver so that checking a GPU step does not copy the KV cache to the host. Tests pin it to the numpy
reference on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashcheck.batch import BatchSpec
from flashcheck.layout import PagedLayout

__all__ = ["attend_padded", "paged_attention_torch", "to_device"]


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
    indices, kv_lens, pages, q_lens, req_d, off_d = to_device(
        torch, dev, [layout.kv_indices, layout.seq_lens[:b], kv[: b + 1], qo_lens, req, off]
    )
    longest_q = int(qo_lens.max()) if b else 0
    padded_kv = -(-int(layout.seq_lens[:b].max()) // page) * page if b else 0
    if b and b * spec.num_qo_heads * longest_q * padded_kv <= _BATCHED_ELEMENTS:
        out[:real] = _batched(
            torch, q[:real], k_cache, v_cache, spec, longest_q, indices, kv_lens, pages, q_lens, (req_d, off_d)
        )
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
    slot = pages[:-1, None] + torch.arange(n_pages, device=dev)[None, :]  # [b, pages] index into kv_indices
    page_ids = indices[slot.clamp(max=indices.numel() - 1)].reshape(-1)
    req, off = rows
    qp = torch.zeros((b, longest_q, *q.shape[1:]), dtype=q.dtype, device=dev)
    qp[req, off] = q
    return attend_padded(torch, qp, k_cache, v_cache, page_ids, kv_lens, q_lens, spec)[req, off]


def attend_padded(
    torch: Any, qp: Any, k_cache: Any, v_cache: Any, page_ids: Any, kv_lens: Any, q_lens: Any, spec: BatchSpec
) -> Any:
    """The one-shot core: queries ``qp`` [b, lq, H, Dqk] (request i's rows first, zeros after), the whole pages
    ``page_ids`` [b * pages] of each request, its kv and query lengths [b] (0 and 0 for an empty row) ->
    fp32 [b, lq, H, Dvo]. Padding (pages past a request's length, rows past its queries) is masked or ignored."""
    dev = qp.device
    b, lq = qp.shape[0], qp.shape[1]
    kh = k_cache.shape[2]
    g = spec.num_qo_heads // kh
    # whole pages gathered as they lie in the cache (one contiguous copy per page: a permuted gather runs several
    # times slower); each matmul reads one KV head of every request through a strided view, with no transposing
    # copy. Padding (pages past a request's length) is masked below
    k = k_cache.index_select(0, page_ids).view(b, -1, kh, k_cache.shape[-1])  # [b, s, KH, Dqk]
    v = v_cache.index_select(0, page_ids).view(b, -1, kh, v_cache.shape[-1])  # [b, s, KH, Dvo]
    s = k.shape[1]
    # fp16/bf16 on CUDA: matmuls of the cache's own dtype with fp32 accumulation and output, the same products and
    # sums as fp32 math without fp32 copies of K and V; else fp32 copies
    low = _low_precision_ok(torch, qp, k_cache)
    dt = qp.dtype if low else torch.float32
    k, v = k.to(dt), v.to(dt)
    qf = qp.to(dt).view(b, lq, kh, g, -1).permute(2, 0, 3, 1, 4).reshape(kh, b, g * lq, -1)  # [KH, b, g*lq, Dqk]
    logits = _per_head(torch, qf, k, low, transpose=True).view(kh, b, g, lq, s) * spec.scale
    if spec.logits_soft_cap > 0:
        logits = spec.logits_soft_cap * torch.tanh(logits / spec.logits_soft_cap)
    key = torch.arange(s, device=dev)[None, None, :]
    pos = (kv_lens - q_lens)[:, None] + torch.arange(lq, device=dev)[None, :]  # [b, lq] position of each query
    visible = key < kv_lens[:, None, None]  # [b, 1 -> lq, s]
    if spec.causal:
        visible = visible & (key <= pos[:, :, None])
    if spec.window_left >= 0:
        visible = visible & (key >= pos[:, :, None] - spec.window_left)
    logits = logits.masked_fill(~visible[None, :, None], float("-inf"))
    p = torch.softmax(logits, dim=-1).nan_to_num(0.0).view(kh, b, g * lq, s)
    if low:  # fp32 probabilities as a sum of cache-dtype terms (2 for fp16, 3 for bf16): one matmul, rows added
        parts, rest = [], p
        for _ in range(2 if dt == torch.float16 else 3):
            parts.append(rest.to(dt))
            rest = rest - parts[-1].float()
        o = _per_head(torch, torch.cat(parts, dim=2), v, low).view(kh, b, len(parts), g * lq, -1).sum(dim=2)
    else:
        o = _per_head(torch, p, v, low)
    return o.view(kh, b, g, lq, -1).permute(1, 3, 0, 2, 4).reshape(b, lq, spec.num_qo_heads, -1)


def _per_head(torch: Any, a: Any, kv: Any, low: bool, *, transpose: bool = False) -> Any:
    """[KH, b, i, k] @ KV head h of [b, s, KH, D] (as [b, D, s] when `transpose`, else [b, s, D]) for every head h ->
    fp32 [KH, b, i, j]: one batched matmul per KV head over a strided view of the gathered pages."""
    heads = []
    for h in range(kv.shape[2]):
        m = kv[:, :, h]
        heads.append(_mm(torch, a[h], m.transpose(1, 2) if transpose else m, low))
    return torch.stack(heads)


_LOW_PRECISION: dict[str, bool] = {}  # per device type: does torch.bmm take out_dtype there (CUDA, torch >= 2.8)?


def _low_precision_ok(torch: Any, q: Any, k_cache: Any) -> bool:
    """Whether the reference may multiply fp16/bf16 operands with fp32 accumulation and output on this device."""
    if q.dtype != k_cache.dtype or q.dtype not in (torch.float16, torch.bfloat16) or q.device.type != "cuda":
        return False
    ok = _LOW_PRECISION.get(q.device.type)
    if ok is None:
        try:
            probe = torch.ones((1, 1, 1), dtype=q.dtype, device=q.device)
            ok = torch.bmm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError):
            ok = False
        _LOW_PRECISION[q.device.type] = ok
    return ok


def _mm(torch: Any, a: Any, b: Any, low: bool) -> Any:
    """Batched [n, i, k] @ [n, k, j] -> fp32; fp32 accumulation of low-precision operands when `low`."""
    return torch.bmm(a, b, out_dtype=torch.float32) if low else torch.bmm(a, b)


class _Staging:
    """One pinned host buffer per device for the reference's small index copies, and the event of its last copy."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.done: Any = None


_STAGING: dict[str, _Staging] = {}


def to_device(torch: Any, dev: Any, arrays: list[Any], out: Any = None) -> list[Any]:
    """int64 device copies of small host int arrays in one transfer (into the int64 buffer `out` when given, e.g.
    a graph's static input). On CUDA it goes through a pinned buffer without a stream sync (a pageable copy waits
    for every kernel queued before it); the buffer is reused only after its previous copy has completed."""
    flat = [np.asarray(a, dtype=np.int64).reshape(-1) for a in arrays]
    n = sum(a.size for a in flat)
    if torch.device(dev).type != "cuda":
        if out is None:
            return [torch.as_tensor(a, device=dev) for a in flat]
        out[:n].copy_(torch.from_numpy(np.concatenate(flat)))
        return _split(out, flat)
    st = _STAGING.get(str(dev))
    if st is None or st.buf.numel() < n:
        st = _STAGING[str(dev)] = _Staging(torch.empty(max(n, 1 << 14), dtype=torch.int64, pin_memory=True))
    elif st.done is not None and not st.done.query():  # asking first: the copy has nearly always completed
        st.done.synchronize()
    host = st.buf[:n]
    host.numpy()[:] = np.concatenate(flat) if flat else []
    if out is None:
        out = host.to(dev, non_blocking=True)
    else:
        out[:n].copy_(host, non_blocking=True)
    st.done = torch.cuda.Event()
    st.done.record()
    return _split(out, flat)


def _split(buf: Any, flat: list[Any]) -> list[Any]:
    parts, at = [], 0
    for a in flat:
        parts.append(buf[at : at + a.size])
        at += a.size
    return parts
