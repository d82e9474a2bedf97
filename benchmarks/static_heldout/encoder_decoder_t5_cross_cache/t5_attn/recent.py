"""Dense attention over the last MAX_DISTANCE keys with the exact T5 bias; FlashInfer covers the rest,
where every key falls in the last bucket and the bias is one constant per head."""

import math

import torch

LOG2E = 1.0 / math.log(2.0)


def recent_attention(q: torch.Tensor, kv_layer: torch.Tensor, recent_slots: torch.Tensor, bias: torch.Tensor):
    """q [bs, H, D]; kv_layer [pages, 2, page, H, D]; recent_slots [bs, R] flat token slots; bias [bs, H, R]."""
    flat = kv_layer.transpose(1, 2).reshape(-1, 2, kv_layer.shape[-2], kv_layer.shape[-1])
    k = flat[recent_slots, 0].float()                      # [bs, R, H, D]
    v = flat[recent_slots, 1].float()
    scores = torch.einsum("bhd,brhd->bhr", q.float(), k) + bias
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.einsum("bhr,brhd->bhd", torch.softmax(scores, dim=-1), v)
    return o.to(q.dtype), lse * LOG2E
