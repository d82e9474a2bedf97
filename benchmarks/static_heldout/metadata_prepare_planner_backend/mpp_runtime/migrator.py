from typing import List

import torch

from mpp_attn.gqa import GqaDecodeBackend


class PageMigrator:
    """Compacts the KV pool between steps: moves live pages down and patches the page ids in place."""

    def __init__(self, backend: GqaDecodeBackend, kv_caches: List[torch.Tensor]):
        self.backend = backend
        self.kv_caches = kv_caches

    def defragment(self, src_pages: torch.Tensor, dst_pages: torch.Tensor, index_slots: torch.Tensor) -> None:
        for cache in self.kv_caches:
            cache[dst_pages] = cache[src_pages]
        # the captured graphs read the planned page ids: rewrite them where the moved pages were
        self.backend.kv_indices_buf[index_slots] = dst_pages.to(torch.int32)  # expect: FC104
