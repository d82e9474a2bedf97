import weakref
from typing import Dict, List

import torch

from fincore.limits import PAGE_SIZE
from fincore.state import RequestState
from finattn.backend import FlashInferAttn


class PagePool:
    __slots__ = ("free", "attn", "_finalizers", "_dead")

    def __init__(self, num_pages: int, attn: FlashInferAttn):
        self.free: List[int] = list(range(num_pages))
        self.attn = attn
        self._finalizers: Dict[str, weakref.finalize] = {}
        self._dead: List[str] = []

    def _check_free(self) -> None:
        assert len(set(self.free)) == len(self.free), "page freed twice"  # ok: FC109

    def alloc(self, n: int) -> List[int]:
        assert n > 0, "zero-page allocation"  # expect: FC109
        if n > len(self.free):
            raise MemoryError(f"need {n} pages, {len(self.free)} free")
        pages, self.free = self.free[:n], self.free[n:]
        return pages

    def admit(self, rid: str, prompt: List[int], temperature: float = 1.0, top_k: int = 0) -> RequestState:
        pages = self.alloc((len(prompt) + 256) // PAGE_SIZE + 1)
        state = RequestState(rid, prompt, pages, temperature, top_k)
        self._finalizers[rid] = weakref.finalize(state, self._release, rid, list(pages))
        self.attn.track(state)
        return state

    def _release(self, rid: str, pages: List[int]) -> None:
        self.free.extend(pages)
        self._dead.append(rid)
        self._finalizers.pop(rid, None)

    def compact(self, remap: torch.Tensor) -> None:
        self._check_free()
        bufs = self.attn.graph_bufs
        bufs["indices"].copy_(remap[bufs["indices"].long()])  # expect: FC104
        masked = bufs["indices"].clone()
        masked.masked_fill_(masked < 0, 0)  # ok: FC104
