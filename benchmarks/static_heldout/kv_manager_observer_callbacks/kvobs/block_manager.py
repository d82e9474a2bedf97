"""Paged KV block manager: page free list, per-request pages, compaction; observers hear every change."""
from typing import Dict, List, Optional

import torch

from kvobs.config import PAGE_SIZE, ServerConfig
from kvobs.listeners import ListenerList


class BlockManager:
    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.cfg = cfg
        self.free_pages: List[int] = list(range(cfg.num_pages - 1, 0, -1))  # page 0 is the padding page
        self.req_pages: Dict[str, List[int]] = {}
        self.pages_freed = ListenerList("pages_freed")  # (pages)
        self.request_aborted = ListenerList("request_aborted")  # (rid, row, num_pages)
        self.compacted = ListenerList("compacted")  # (remap_cpu: old page -> new page)
        self.copy_stream = torch.cuda.Stream(device)
        self.move_workspace = torch.empty(cfg.num_pages * 2, dtype=torch.int32, device=device)  # ok: FC106

    def _take(self, n: int) -> List[int]:
        assert n <= len(self.free_pages)  # ok: FC109
        return [self.free_pages.pop() for _ in range(n)]

    def ensure(self, rid: str, num_tokens: int) -> List[int]:
        pages = self.req_pages.setdefault(rid, [])
        pages += self._take(max(0, -(-num_tokens // PAGE_SIZE) - len(pages)))
        return pages

    def free(self, rid: str) -> None:
        assert rid in self.req_pages  # expect: FC109
        pages = self.req_pages.pop(rid)
        self.free_pages.extend(pages)
        self.pages_freed.emit(pages)

    def abort(self, rid: str, row: int) -> None:
        pages = self.req_pages.pop(rid, [])
        self.free_pages.extend(pages)
        self.request_aborted.emit(rid, row, len(pages))

    def maybe_compact(self) -> Optional[torch.Tensor]:
        used = sorted(p for pages in self.req_pages.values() for p in pages)
        if not used or len(used) > self.cfg.compact_threshold * used[-1]:
            return None
        assert used == sorted(set(used))  # ok: FC109
        remap = torch.arange(self.cfg.num_pages, dtype=torch.int32)
        remap[torch.tensor(used)] = torch.arange(1, len(used) + 1, dtype=torch.int32)
        moved = (remap != torch.arange(self.cfg.num_pages, dtype=torch.int32)).nonzero().flatten()  # ok: FC101
        for pages in self.req_pages.values():
            pages[:] = remap[torch.tensor(pages, dtype=torch.long)].tolist()
        self.free_pages = list(range(self.cfg.num_pages - 1, len(used), -1))
        if moved.numel():
            self.compacted.emit(remap)
        return remap
