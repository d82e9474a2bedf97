"""A paged KV pool in one layout."""

import numpy as np
import torch

from kvlayout.layouts import KVLayout, page_shape, token_strides


class LayoutKVPool:
    def __init__(self, num_layers, num_pages, page_size, num_kv_heads, head_dim, layout, device, dtype=torch.float16):
        assert layout in (KVLayout.NHD, KVLayout.HND)  # expect: FC109
        self.layout = layout
        self._kv_layout = layout.value
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = device
        shape = page_shape(layout, page_size, num_kv_heads, head_dim)
        self.page_elems = shape[0] * shape[1] * shape[2]
        self.caches = [torch.zeros((num_pages, 2) + shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._strides = {layout: token_strides(layout, page_size, num_kv_heads, head_dim)}
        # page 0 is the trash page: rows of the other layout write there
        self._free = list(range(num_pages - 1, 0, -1))
        self.used = 1
        self._rows = {}
        max_pages = 4096
        self.req_to_page = torch.zeros(64, max_pages, dtype=torch.int32, device=device)
        self.req_to_page_np = np.zeros((64, max_pages), dtype=np.int32)

    def alloc(self, n: int) -> list:
        if n > len(self._free):
            raise MemoryError(f"{self.layout.value} pool: need {n} pages, {len(self._free)} free")
        self.used += n
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: list):
        self._free.extend(pages)
        self.used -= len(pages)

    def assign_row(self, rid: int) -> int:
        return self._rows.setdefault(rid, len(self._rows))

    def check_invariants(self):
        assert len(self._free) + self.used == self.num_pages  # ok: FC109

    def _strides_for(self, layout):
        strides = self._strides.get(layout)
        assert strides is not None, "strides exist only for the pool's own layout"  # ok: FC109
        return strides

    def flat_offset(self, page_id: int, kv: int, token: int, head: int) -> int:
        """Element offset of (token, head) of K (kv=0) or V (kv=1) in page ``page_id``: RDMA descriptors."""
        tok_stride, head_stride = self._strides_for(self.layout)
        return (page_id * 2 + kv) * self.page_elems + token * tok_stride + head * head_stride

    def write_tokens(self, layer_id: int, k, v, pages, offsets):
        cache = self.caches[layer_id]
        if self.layout is KVLayout.NHD:
            cache[pages, 0, offsets] = k
            cache[pages, 1, offsets] = v
        else:
            cache[pages, 0, :, offsets] = k
            cache[pages, 1, :, offsets] = v
