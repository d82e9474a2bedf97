"""Copy-on-blend: chunk pages are shared with the store, so the layers >= 1 KV of recomputed tokens
must land in private copies of those pages."""
from __future__ import annotations

import torch

from blendserve.batch import ForwardBatch
from blendserve.blend.selector import SelectedTokens


class BlendCoW:
    def __init__(self, kv_pool, page_size: int):
        self.kv_pool = kv_pool
        self.page_size = page_size

    def privatize(self, fb: ForwardBatch, sel: SelectedTokens) -> torch.Tensor:
        # page slots of the batch's page list that hold a selected token and are shared with the store
        shared_pos, fresh_pages = self.kv_pool.copy_shared_pages(fb, sel)
        fb.kv_indices[shared_pos] = fresh_pages  # expect: FC104
        page_of_slot = sel.slots // self.page_size
        return self.kv_pool.remap_slots(sel.slots, page_of_slot, shared_pos, fresh_pages)
