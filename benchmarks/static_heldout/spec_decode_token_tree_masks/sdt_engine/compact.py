"""After acceptance, the KV of the accepted path moves to the slots right after the committed prefix."""
from typing import List

import torch
from flashcheck import hot_path

from sdt import TreeBatch
from sdt_attn.tree_backend import TreeAttnBackend
from sdt_engine.model import KVCache
from sdt_engine.verify import AcceptResult


class KVCompactor:
    def __init__(self, backend: TreeAttnBackend, caches: List[KVCache], page_size: int, device: torch.device):
        self.backend = backend
        self.caches = caches
        self.page_size = page_size
        self.accept_hist = torch.zeros(0, dtype=torch.int64, device=device)

    @hot_path
    def compact(self, batch: TreeBatch, res: AcceptResult) -> None:
        bs = batch.batch_size
        slots = batch.out_loc.view(bs, -1)
        path = res.path_nodes
        depth = path.shape[1]
        src = slots.gather(1, path.clamp(min=0))
        dst = slots[:, :depth]
        keep = (path >= 0).unsqueeze(-1).unsqueeze(-1)
        for k_cache, v_cache in self.caches:
            for cache in (k_cache, v_cache):
                flat = cache.view(-1, *cache.shape[2:])
                flat[dst] = torch.where(keep, flat[src], flat[dst])
        # the tree's slots past the accepted path are free again: shrink each row's last page
        new_last = (batch.seq_lens_dev + res.accept_lens - 1) % self.page_size + 1
        self.backend.last_page_buf[:bs].copy_(new_last)  # expect: FC104
        self.accept_hist = torch.cat([self.accept_hist, res.accept_lens])  # expect: FC107
