from __future__ import annotations

from typing import Dict, List

import torch

from lgroups.spec import LayerGroupSpec


class GroupKVPool:
    """Pages of one layer group; every layer of the group has its own cache tensor."""

    def __init__(self, spec: LayerGroupSpec, device: torch.device, dtype: torch.dtype = torch.bfloat16):
        assert spec.page_size in (8, 16, 32, 64), "FlashInfer decode kernels take pages of 8 to 64 tokens"  # expect: FC109
        self.spec = spec
        self.num_pages = spec.num_pages
        self._kv_layout = spec.kv_layout
        if spec.kv_layout == "NHD":
            shape = (spec.num_pages, 2, spec.page_size, spec.num_kv_heads, spec.head_dim)
        else:
            shape = (spec.num_pages, 2, spec.num_kv_heads, spec.page_size, spec.head_dim)
        self.kv: Dict[int, torch.Tensor] = {
            lid: torch.zeros(shape, dtype=dtype, device=device) for lid in spec.layer_ids
        }
        self._free: List[int] = list(range(spec.num_pages - 1, -1, -1))

    def layout(self) -> str:
        return self._kv_layout  # ok: FC103

    def alloc(self, n: int) -> List[int]:
        if n > len(self._free):
            raise MemoryError(f"group {self.spec.name}: {n} pages wanted, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        self._check_free()
        return out

    def free(self, pages: List[int]) -> None:
        self._free.extend(pages)
        self._check_free()

    def _check_free(self) -> None:
        assert len(self._free) <= self.num_pages, "a page was freed twice"  # ok: FC109

    def write(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        kv = self.kv[layer_id]
        page, off = slots // self.spec.page_size, slots % self.spec.page_size
        if self._kv_layout == "NHD":
            kv[page, 0, off] = k
            kv[page, 1, off] = v
        else:
            kv[page, 0, :, off] = k
            kv[page, 1, :, off] = v
        return kv
