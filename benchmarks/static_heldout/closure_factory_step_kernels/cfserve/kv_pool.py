"""Page pool (host free list and page ownership) and the closures that release and compact pages."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import torch


@dataclasses.dataclass
class Remap:
    src: torch.Tensor  # live page ids before compaction (device)
    dst: torch.Tensor  # their new ids (device)
    table: torch.Tensor  # old id -> new id for every page (device)
    num_live: int


class PagePool:
    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.owner = np.full(num_pages, -1, dtype=np.int64)
        self.free = list(range(num_pages - 1, -1, -1))
        self.pages: dict[int, list[int]] = {}

    def _pop(self) -> int:
        assert self.free, "alloc() checks capacity before popping"  # ok: FC109
        return self.free.pop()

    def pages_of(self, rid: int) -> list[int]:
        return self.pages[rid]

    def reserve(self, rid: int, seq_len: int) -> None:
        have = self.pages.setdefault(rid, [])
        need = (seq_len + self.page_size - 1) // self.page_size - len(have)
        if need > len(self.free):
            raise MemoryError(f"request {rid} needs {need} pages, {len(self.free)} free")
        for _ in range(max(need, 0)):
            p = self._pop()
            self.owner[p] = rid
            have.append(p)

    def free_request(self, rid: int) -> None:
        for p in self.pages.pop(rid, []):
            self.owner[p] = -1
            self.free.append(p)

    def build_remap(self, device: torch.device) -> Optional[Remap]:
        """Moves live pages to the lowest ids when more than a quarter of the used range is holes."""
        live = np.flatnonzero(self.owner >= 0)
        if live.size == 0 or live[-1] + 1 < 1.25 * live.size:
            return None
        table = np.arange(self.owner.shape[0], dtype=np.int32)
        table[live] = np.arange(live.size, dtype=np.int32)
        new_owner = np.full_like(self.owner, -1)
        new_owner[: live.size] = self.owner[live]
        self.owner = new_owner
        self.free = list(range(self.owner.shape[0] - 1, live.size - 1, -1))
        self.pages = {rid: [int(table[p]) for p in ps] for rid, ps in self.pages.items()}
        return Remap(
            src=torch.from_numpy(live.astype(np.int64)).to(device, non_blocking=True),
            dst=torch.arange(live.size, dtype=torch.int64, device=device),
            table=torch.from_numpy(table).to(device, non_blocking=True),
            num_live=int(live.size),
        )


def make_release_fn(pool: PagePool, req_to_token: torch.Tensor, eos_id: int) -> Callable:
    """Returns ``release(batch, next_ids)``: clears the rows of requests that hit EOS and frees finished ones."""
    released = 0

    def release(batch, next_ids: torch.Tensor) -> None:
        nonlocal released
        hit_eos = next_ids == eos_id
        rows = batch.req_pool_idx[hit_eos]  # expect: FC101
        req_to_token[rows] = 0
        done = batch.req_ids_np[batch.finished_np]  # ok: FC101
        for rid in map(int, done):
            pool.free_request(rid)
        released += len(done)

    return release


def make_compactor(bufs, kv_caches: list[torch.Tensor], req_to_token: torch.Tensor) -> Callable[[Remap], None]:
    """Returns ``compact(remap)``: moves KV pages down and rewrites every page table that names them."""
    moved = 0

    def compact(remap: Remap) -> None:
        nonlocal moved
        for cache in kv_caches:
            cache[remap.dst] = cache[remap.src]
        req_to_token.copy_(remap.table[req_to_token.long()])
        # keep the graph's page list in step with the move so the next replay reads the new ids
        bufs.kv_indices.copy_(remap.table[bufs.kv_indices.long()])  # expect: FC104
        moved += remap.num_live

    return compact
