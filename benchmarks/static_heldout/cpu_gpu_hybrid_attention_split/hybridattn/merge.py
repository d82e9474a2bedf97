"""LSE merge of the GPU window's partial attention with the host's, on the GPU (log2 lse, as FlashInfer)."""

import torch


def merge_partials(o_near: torch.Tensor, lse_near: torch.Tensor, o_far: torch.Tensor, lse_far: torch.Tensor):
    if torch.isinf(lse_far).all():  # expect: FC101
        return o_near
    m = torch.maximum(lse_near, lse_far)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # ok: FC101
    w_near = torch.exp2(lse_near - m)
    w_far = torch.exp2(lse_far - m)
    denom = (w_near + w_far).unsqueeze(-1)
    o = o_near.float() * (w_near.unsqueeze(-1) / denom) + o_far * (w_far.unsqueeze(-1) / denom)
    return o.to(o_near.dtype)
