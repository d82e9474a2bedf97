"""Two page pools: the full pool grows with the context, the SWA pool keeps a bounded ring per request."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from swahybrid.config import HybridConfig, LayerKind, layer_kinds

NULL_PAGE = 0


class _Pool:
    def __init__(self, num_pages: int, num_layers: int, cfg: HybridConfig, device: torch.device) -> None:
        self.page_size = cfg.page_size
        self.kv_heads, self.head_dim = cfg.num_kv_heads, cfg.head_dim
        shape = (num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(num_layers)]
        self._free: List[int] = list(range(num_pages - 1, NULL_PAGE, -1))
        self.pages: Dict[int, List[int]] = {}
        self._kv_layout = "NHD"

    def kv(self, index: int) -> torch.Tensor:
        return self.caches[index]

    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> List[int]:
        if n > len(self._free):
            raise MemoryError(f"{n} pages requested, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def give_back(self, pages: Sequence[int]) -> None:
        self._free.extend(pages)

    def write(self, index: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        pages = loc // self.page_size
        offs = loc % self.page_size
        self.caches[index][pages, 0, offs] = k
        self.caches[index][pages, 1, offs] = v


class FullPool(_Pool):
    def pages_of(self, rid: int) -> List[int]:
        return self.pages[rid]


class SwaPool(_Pool):
    def __init__(self, num_pages: int, num_layers: int, cfg: HybridConfig, device: torch.device) -> None:
        super().__init__(num_pages, num_layers, cfg, device)
        self.ring = cfg.swa_pages_per_req
        self.first_pos: Dict[int, int] = {}  # position of the first token on the oldest kept page

    def retire_oldest(self, rid: int) -> None:
        pages = self.pages[rid]
        if len(pages) > self.ring:
            self.give_back([pages.pop(0)])
            self.first_pos[rid] += self.page_size
        self._check_ring()

    def window_pages(self, rids: Sequence[int], keep: int) -> List[List[int]]:
        return [self.pages[r][-keep:] for r in rids]

    def _check_ring(self) -> None:
        assert all(len(p) <= self.ring for p in self.pages.values()), "SWA ring overflow"  # ok: FC109


class TwoPools:
    def __init__(self, cfg: HybridConfig, device: torch.device) -> None:
        kinds = layer_kinds(cfg.num_layers, cfg.full_every)
        self.index: Dict[int, Tuple[LayerKind, int]] = {}
        counts = {LayerKind.SWA: 0, LayerKind.FULL: 0}
        for layer, kind in enumerate(kinds):
            self.index[layer] = (kind, counts[kind])
            counts[kind] += 1
        self.full = FullPool(cfg.full_pool_pages, counts[LayerKind.FULL], cfg, device)
        self.swa = SwaPool(cfg.swa_pool_pages, counts[LayerKind.SWA], cfg, device)
        self.page_size = cfg.page_size
        self.lens: Dict[int, int] = {}

    def admit(self, rid: int, prompt_len: int) -> None:
        assert prompt_len > 0, "empty prompt"  # expect: FC109
        n = (prompt_len + self.page_size - 1) // self.page_size
        self.full.pages[rid] = self.full.take(n)
        keep = min(n, self.swa.ring)
        self.swa.pages[rid] = self.swa.take(keep)
        self.swa.first_pos[rid] = (n - keep) * self.page_size
        self.lens[rid] = prompt_len

    def grow(self, rid: int) -> Tuple[int, int]:
        """One more token: (full slot, SWA slot)."""
        n = self.lens[rid]
        if n % self.page_size == 0:
            self.full.pages[rid] += self.full.take(1)
            self.swa.pages[rid] += self.swa.take(1)
        self.lens[rid] = n + 1
        off = n % self.page_size
        return self.full.pages[rid][-1] * self.page_size + off, self.swa.pages[rid][-1] * self.page_size + off

    def release(self, rid: int) -> None:
        self.full.give_back(self.full.pages.pop(rid))
        self.swa.give_back(self.swa.pages.pop(rid))
        self.swa.first_pos.pop(rid, None)
        self.lens.pop(rid)

    def kv(self, layer: int) -> Tuple[LayerKind, torch.Tensor]:
        kind, idx = self.index[layer]
        pool = self.full if kind is LayerKind.FULL else self.swa
        return kind, pool.kv(idx)

    def write_kv(self, layer: int, k, v, full_loc, swa_loc) -> None:
        kind, idx = self.index[layer]
        if kind is LayerKind.FULL:
            self.full.write(idx, k, v, full_loc)
        else:
            self.swa.write(idx, k, v, swa_loc)
