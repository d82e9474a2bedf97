"""fp32 reference attention in torch, on any device (the GPU oracle; same math as `reference.attention`).

Used by the driver so that checking a GPU step does not copy the KV cache to the host. Tests pin it to the numpy
reference on CPU.
"""

from __future__ import annotations

from typing import Any

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
    indices = torch.as_tensor(layout.kv_indices, device=dev, dtype=torch.long)
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
