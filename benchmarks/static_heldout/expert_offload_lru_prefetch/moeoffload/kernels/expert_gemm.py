import torch
import triton
import triton.language as tl


@triton.jit
def _gather_slot_kernel(topk_ids_ptr, slot_map_ptr, out_ptr, n, BLOCK: tl.constexpr):
    assert BLOCK >= 16  # ok: FC109
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    e = tl.load(topk_ids_ptr + offs, mask=m, other=0)
    s = tl.load(slot_map_ptr + e, mask=m, other=-1)
    tl.store(out_ptr + offs, s, mask=m)


def expert_slots_for(topk_ids, slot_map_row, out):
    """Map routed expert ids to GPU slot ids (-1: not resident) without leaving the device."""
    n = topk_ids.numel()
    grid = (triton.cdiv(n, 128),)
    _gather_slot_kernel[grid](topk_ids, slot_map_row, out, n, BLOCK=128)
    return out[:n].view(topk_ids.shape)


def grouped_expert_ffn(h, topk_w, slots, w13_slots, w2_slots):
    """Dense per-token expert FFN over the GPU slots; non-resident experts contribute zero."""
    valid = slots >= 0
    safe = torch.where(valid, slots, torch.zeros_like(slots))  # ok: FC101
    up = torch.einsum("th,tkfh->tkf", h, w13_slots[safe])
    gate, lin = up.chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate) * lin
    down = torch.einsum("tkf,tkhf->tkh", act, w2_slots[safe])
    weight = torch.where(valid, topk_w, torch.zeros_like(topk_w))
    return (down * weight.unsqueeze(-1)).sum(dim=1)
