"""Move KV heads between ranks when the TP degree changes."""
from __future__ import annotations

import torch
import torch.distributed as dist

from elastictp.kv import ShardedKVCache
from elastictp.limits import EngineLimits
from elastictp.topology import ModelDims, TPLayout


def reshard_kv_heads(
    kv: ShardedKVCache,
    old: TPLayout,
    new: TPLayout,
    group,
    dims: ModelDims,
    limits: EngineLimits,
    device: torch.device,
) -> ShardedKVCache:
    out = ShardedKVCache(dims, limits, new, device)
    for layer, pages in enumerate(kv.pages):
        gathered = [torch.empty_like(pages) for _ in range(old.tp)]
        dist.all_gather(gathered, pages.contiguous(), group=group)
        if old.kv_replicated:
            # every rank held one head; keep one copy per distinct head
            step = old.tp // dims.num_kv_heads
            full = torch.cat(gathered[::step], dim=3)
        else:
            full = torch.cat(gathered, dim=3)
        if new.kv_replicated:
            head = new.kv_head_of_rank(dims.num_kv_heads)
            out.pages[layer].copy_(full[:, :, :, head : head + 1])
        else:
            lo = new.rank * new.kv_heads
            out.pages[layer].copy_(full[:, :, :, lo : lo + new.kv_heads])
    return out
