"""fp32 reference attention over paged and ragged layouts (numpy, no torch).

Covers causal and non-causal prefill, decode, GQA/MQA, sliding window (``window_left``), logits soft cap and
split head dims (MLA: ``head_dim_qk != head_dim_vo``). Padded rows (beyond the layout's real batch) are left 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument
from flashcheck.layout import PagedLayout, RaggedLayout

__all__ = ["gather_paged_kv", "mla_reference", "paged_attention", "ragged_attention", "request_attention"]

F32 = npt.NDArray[np.float32]


def _f32(x: Any) -> F32:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def request_attention(
    q: F32,
    k: F32,
    v: F32,
    *,
    causal: bool,
    scale: float,
    window_left: int = -1,
    logits_soft_cap: float = 0.0,
) -> F32:
    """Attention of one request. q: [L, H, Dqk]; k: [S, KH, Dqk]; v: [S, KH, Dvo] -> [L, H, Dvo] (fp32).

    Query row r sits at KV position ``S - L + r`` (bottom-right alignment, as FlashInfer and the engines do).
    """
    length, heads, _ = q.shape
    s_len, kv_heads, _ = k.shape
    if heads % kv_heads:
        raise InvalidArgument(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    if s_len < length:
        raise InvalidArgument(f"kv length {s_len} < query length {length}")
    g = heads // kv_heads
    k_h = np.repeat(k, g, axis=1)  # [S, H, D]
    v_h = np.repeat(v, g, axis=1)
    logits = np.einsum("lhd,shd->hls", q, k_h, dtype=np.float32) * np.float32(scale)
    if logits_soft_cap > 0:
        logits = np.float32(logits_soft_cap) * np.tanh(logits / np.float32(logits_soft_cap))
    pos = (s_len - length + np.arange(length))[:, None]
    key = np.arange(s_len)[None, :]
    visible = np.ones((length, s_len), dtype=bool)
    if causal:
        visible &= key <= pos
    if window_left >= 0:
        visible &= key >= pos - window_left
    logits = np.where(visible[None], logits, -np.inf)
    m = logits.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(logits - m)
    denom = p.sum(axis=-1, keepdims=True)
    p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
    out = np.einsum("hls,shd->lhd", p, v_h, dtype=np.float32)
    return np.asarray(out, dtype=np.float32)


def gather_paged_kv(cache: F32, indices: npt.NDArray[Any], pages: slice, last_page_len: int, page_size: int) -> F32:
    """Rows of one request from a paged cache [num_pages, page_size, KH, D] (NHD layout)."""
    ids = indices[pages]
    if len(ids) == 0:
        return np.asarray(cache[:0, 0], dtype=np.float32)
    rows = cache[ids].reshape(len(ids) * page_size, *cache.shape[2:])
    return np.asarray(rows[: (len(ids) - 1) * page_size + last_page_len], dtype=np.float32)


def paged_attention(q: Any, k_cache: Any, v_cache: Any, layout: PagedLayout, spec: BatchSpec | None = None) -> F32:
    """Reference output for a paged batch.

    Args:
        q: [layout.total_qo_rows, H, Dqk] queries (any float dtype; computed in fp32).
        k_cache, v_cache: [num_pages, page_size, KH, D] caches in NHD layout.
        layout: the CSR metadata (real rows are ``[0, layout.batch_size)``).
        spec: attention parameters; defaults to ``layout.spec``.
    Returns:
        [total_qo_rows, H, Dvo] fp32; rows of padded requests are 0.
    """
    spec = spec or layout.spec
    qf, kf, vf = _f32(q), _f32(k_cache), _f32(v_cache)
    if kf.ndim != 4 or kf.shape[1] != spec.page_size:
        raise InvalidArgument(f"k_cache must be [num_pages, page_size={spec.page_size}, KH, D], got {kf.shape}")
    out = np.zeros((qf.shape[0], spec.num_qo_heads, vf.shape[-1]), dtype=np.float32)
    for i in range(layout.batch_size):
        q0, q1 = int(layout.qo_indptr[i]), int(layout.qo_indptr[i + 1])
        pages = slice(int(layout.kv_indptr[i]), int(layout.kv_indptr[i + 1]))
        last = int(layout.kv_last_page_len[i])
        k = gather_paged_kv(kf, layout.kv_indices, pages, last, spec.page_size)
        v = gather_paged_kv(vf, layout.kv_indices, pages, last, spec.page_size)
        out[q0:q1] = request_attention(
            qf[q0:q1],
            k,
            v,
            causal=spec.causal,
            scale=spec.scale,
            window_left=spec.window_left,
            logits_soft_cap=spec.logits_soft_cap,
        )
    return out


def ragged_attention(q: Any, k: Any, v: Any, layout: RaggedLayout, spec: BatchSpec | None = None) -> F32:
    """Reference output for a ragged batch: q [total_qo, H, Dqk], k/v [total_kv, KH, D]."""
    spec = spec or layout.spec
    qf, kf, vf = _f32(q), _f32(k), _f32(v)
    out = np.zeros((qf.shape[0], spec.num_qo_heads, vf.shape[-1]), dtype=np.float32)
    for i in range(layout.batch_size):
        q0, q1 = int(layout.qo_indptr[i]), int(layout.qo_indptr[i + 1])
        k0, k1 = int(layout.kv_indptr[i]), int(layout.kv_indptr[i + 1])
        out[q0:q1] = request_attention(
            qf[q0:q1],
            kf[k0:k1],
            vf[k0:k1],
            causal=spec.causal,
            scale=spec.scale,
            window_left=spec.window_left,
            logits_soft_cap=spec.logits_soft_cap,
        )
    return out


def mla_reference(q_nope: Any, q_pe: Any, ckv_cache: Any, kpe_cache: Any, layout: PagedLayout, scale: float) -> F32:
    """MLA (absorbed) reference: logits = q_nope·ckv + q_pe·kpe, output = p·ckv.

    q_nope [T, H, Dckv], q_pe [T, H, Dkpe], ckv_cache [P, page, Dckv], kpe_cache [P, page, Dkpe] -> [T, H, Dckv].
    """
    qn, qp, ckv, kpe = _f32(q_nope), _f32(q_pe), _f32(ckv_cache), _f32(kpe_cache)
    q = np.concatenate([qn, qp], axis=-1)
    k = np.concatenate([ckv, kpe], axis=-1)[:, :, None, :]
    v = ckv[:, :, None, :]
    mla_spec = dataclasses.replace(
        layout.spec, num_kv_heads=1, head_dim_qk=q.shape[-1], head_dim_vo=v.shape[-1], sm_scale=scale
    )
    return paged_attention(q, k, v, layout, mla_spec)
