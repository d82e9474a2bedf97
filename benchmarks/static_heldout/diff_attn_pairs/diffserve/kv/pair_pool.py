"""Page pool shared by the two branch caches of every layer.

A page id addresses the same slot in the ``pos`` and ``neg`` caches, so the host page table is built once per step
and both branches are planned from it.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from diffserve.config import BRANCHES, DiffConfig


class PairedKVPool:
    def __init__(self, cfg: DiffConfig, num_pages: int, page_size: int, device: torch.device, dtype=torch.bfloat16):
        assert page_size in (16, 32, 64), "decode kernels are instantiated for these page sizes"  # expect: FC109
        self.cfg = cfg
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = device
        shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        # one key cache per branch, one value cache shared by both: FlashInfer takes (k_cache, v_cache) tuples
        self.k_pages: List[Dict[str, torch.Tensor]] = [
            {b: torch.zeros(shape, dtype=dtype, device=device) for b in BRANCHES} for _ in range(cfg.num_layers)
        ]
        self.v_pages: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.free = list(range(num_pages - 1, 0, -1))  # page 0 is the null page of padded rows
        self.used = 1
        self.req_pages: Dict[int, List[int]] = {}
        self.req_lens: Dict[int, int] = {}
        self.moved: Dict[int, int] = {}

    def layer_caches(self, layer_id: int):
        k, v = self.k_pages[layer_id], self.v_pages[layer_id]
        return (k["pos"], v), (k["neg"], v)

    def store(self, layer_id: int, k_pos: torch.Tensor, k_neg: torch.Tensor, v: torch.Tensor, loc: torch.Tensor):
        kvh, d = self.cfg.num_kv_heads, self.cfg.head_dim
        k = self.k_pages[layer_id]
        k["pos"].view(-1, kvh, d)[loc] = k_pos
        k["neg"].view(-1, kvh, d)[loc] = k_neg
        self.v_pages[layer_id].view(-1, kvh, d)[loc] = v

    def check_free_list(self) -> None:
        assert self.used + len(self.free) == self.num_pages, "page leak"  # ok: FC109

    def reserve(self, rid: int, new_len: int) -> None:
        pages = self.req_pages.setdefault(rid, [])
        need = -(-new_len // self.page_size) - len(pages)
        if need > len(self.free):
            raise MemoryError(f"request {rid} needs {need} pages, {len(self.free)} free")
        for _ in range(need):
            pages.append(self.free.pop())
            self.used += 1
        self.req_lens[rid] = new_len

    def release(self, rid: int) -> None:
        pages = self.req_pages.pop(rid, [])
        self.free.extend(pages)
        self.used -= len(pages)
        self.req_lens.pop(rid, None)

    def page_table(self, rids: Sequence[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        lens = np.array([self.req_lens[r] for r in rids], dtype=np.int64)
        counts = -(-lens // self.page_size)
        indptr = np.zeros(len(rids) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.fromiter(
            (p for r in rids for p in self.req_pages[r]), dtype=np.int32, count=int(indptr[-1])
        )
        last = (lens - (counts - 1) * self.page_size).astype(np.int32)
        return indptr, indices, last

    def compact(self) -> Dict[int, int]:
        """Move the pages of long-lived requests to the low end of the pool; returns old -> new page ids."""
        live = sorted(p for pages in self.req_pages.values() for p in pages)
        moved = {old: new for new, old in enumerate(live, start=1) if old != new}
        for rid, pages in self.req_pages.items():
            self.req_pages[rid] = [moved.get(p, p) for p in pages]
        if moved:
            src = torch.tensor(list(moved.keys()), device=self.device)
            dst = torch.tensor(list(moved.values()), device=self.device)
            for keys, values in zip(self.k_pages, self.v_pages):
                for cache in (keys["pos"], keys["neg"], values):
                    cache[dst] = cache[src]
        self.free = list(range(self.num_pages - 1, len(live), -1))
        self.moved = moved
        return moved
