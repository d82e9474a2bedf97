"""Host mirrors of per-step metadata in ``multiprocessing.shared_memory``.

The driver creates the segment and writes numpy views of it; each worker
attaches by name and wraps the same views with ``torch.from_numpy`` (no copy),
so the host-side indptr/lengths a FlashInfer ``plan()`` needs never leave the
CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Optional

import numpy as np

from .config import EngineConfig

_INT32 = np.dtype(np.int32)


@dataclass(frozen=True)
class MirrorLayout:
    max_batch_size: int
    max_num_pages: int
    max_num_tokens: int

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> "MirrorLayout":
        return cls(cfg.max_batch_size, cfg.max_num_pages, cfg.max_num_tokens)

    def nbytes(self) -> int:
        bs = self.max_batch_size
        slots = 3 * bs + 2 * (bs + 1) + self.max_num_pages + 2 * self.max_num_tokens
        return slots * _INT32.itemsize


class HostMirror:
    def __init__(self, shm: shared_memory.SharedMemory, layout: MirrorLayout, owner: bool) -> None:
        self._shm: Optional[shared_memory.SharedMemory] = shm
        self._owner = owner
        self._cursor = 0
        self.layout = layout
        bs = layout.max_batch_size
        self.seq_lens_np = self._view(bs)
        self.kv_last_page_len_np = self._view(bs)
        self.num_computed_np = self._view(bs)
        self.qo_indptr_np = self._view(bs + 1)
        self.kv_indptr_np = self._view(bs + 1)
        self.kv_indices_np = self._view(layout.max_num_pages)
        self.token_ids_np = self._view(layout.max_num_tokens)
        self.positions_np = self._view(layout.max_num_tokens)

    def _view(self, n: int) -> np.ndarray:
        arr = np.ndarray((n,), dtype=_INT32, buffer=self._shm.buf, offset=self._cursor)
        self._cursor += n * _INT32.itemsize
        return arr

    @property
    def name(self) -> str:
        return self._shm.name

    @classmethod
    def create(cls, layout: MirrorLayout) -> "HostMirror":
        shm = shared_memory.SharedMemory(create=True, size=layout.nbytes())
        mirror = cls(shm, layout, owner=True)
        mirror.kv_last_page_len_np[:] = 1
        return mirror

    @classmethod
    def attach(cls, name: str, layout: MirrorLayout) -> "HostMirror":
        shm = shared_memory.SharedMemory(name=name)
        if shm.size < layout.nbytes():
            raise ValueError(f"shared segment {name} holds {shm.size} bytes, layout needs {layout.nbytes()}")
        return cls(shm, layout, owner=False)

    def close(self) -> None:
        assert self._shm is not None, "mirror closed twice"  # ok: FC109
        # drop the numpy views before closing the mapping
        self.seq_lens_np = self.kv_last_page_len_np = self.num_computed_np = None
        self.qo_indptr_np = self.kv_indptr_np = self.kv_indices_np = None
        self.token_ids_np = self.positions_np = None
        self._shm.close()
        if self._owner:
            self._shm.unlink()
        self._shm = None
