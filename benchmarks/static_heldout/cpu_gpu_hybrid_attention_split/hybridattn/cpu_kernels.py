"""Host attention over offloaded pages (torch CPU kernels, fp32 accumulation)."""

import math

import numpy as np
import torch

LOG2E = 1.0 / math.log(2.0)


@torch.jit.script
def lse_combine_host(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    assert o_a.dim() == 3 and o_b.dim() == 3  # ok: FC109
    m = torch.maximum(lse_a, lse_b)
    wa = torch.exp(lse_a - m)
    wb = torch.exp(lse_b - m)
    o = (o_a * wa.unsqueeze(-1) + o_b * wb.unsqueeze(-1)) / (wa + wb).unsqueeze(-1)
    return o, m + torch.log(wa + wb)


def attend_far(q_host: torch.Tensor, k_pages_host: torch.Tensor, v_pages_host: torch.Tensor,
               page_ids_np: np.ndarray, n_tokens: int, scale: float):
    """One row's query [H, D] over its host pages; returns (o [H, D] fp32, lse [H] in log2)."""
    ids = torch.from_numpy(page_ids_np.astype(np.int64))
    k = k_pages_host.index_select(0, ids).flatten(0, 1)[:n_tokens].float()
    v = v_pages_host.index_select(0, ids).flatten(0, 1)[:n_tokens].float()
    group = q_host.shape[0] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", q_host.float(), k) * scale
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return o, lse * LOG2E


def attend_far_chunked(q_host, k_pages_host, v_pages_host, page_ids_np, n_tokens, scale, chunk_pages: int = 256):
    """Long rows are split into chunks so that one worker's scores stay in cache."""
    o, lse = None, None
    for start in range(0, len(page_ids_np), chunk_pages):
        ids_np = page_ids_np[start : start + chunk_pages]
        n = min(n_tokens - start * k_pages_host.shape[1], len(ids_np) * k_pages_host.shape[1])
        o_c, lse_c = attend_far(q_host, k_pages_host, v_pages_host, ids_np, n, scale)
        if o is None:
            o, lse = o_c, lse_c
        else:
            o, lse = lse_combine_host(o.unsqueeze(0), lse.unsqueeze(0), o_c.unsqueeze(0), lse_c.unsqueeze(0))
            o, lse = o[0], lse[0]
    return o, lse
