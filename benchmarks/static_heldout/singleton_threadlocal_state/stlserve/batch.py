"""Requests and the per-step batch a worker thread runs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Sequence

import numpy as np
import torch

from stlserve.config import EngineConfig

if TYPE_CHECKING:
    from stlserve.graph_runner import GraphBuffers


class ForwardMode(enum.IntEnum):
    DECODE = 1
    EXTEND = 2


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    page_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    temperature: float = 1.0
    cached_len: int = 0

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class ForwardBatch:
    """One worker thread's step. Device tensors beside the pinned ``*_cpu`` mirrors they were uploaded from."""

    forward_mode: ForwardMode
    batch_size: int
    is_decode: bool
    max_seq_len: int
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor
    temperatures: torch.Tensor

    @classmethod
    def from_requests(
        cls,
        reqs: Sequence[Request],
        mode: ForwardMode,
        device: torch.device,
        ids_staging: Optional[torch.Tensor] = None,
    ) -> "ForwardBatch":
        cfg = EngineConfig.get_instance()
        bs = len(reqs)
        seq = np.array([r.seq_len for r in reqs], dtype=np.int32)
        if mode == ForwardMode.DECODE:
            q_lens = np.ones(bs, dtype=np.int32)
            ids = [r.output_ids[-1] if r.output_ids else r.prompt_ids[-1] for r in reqs]
        else:
            q_lens = np.array([r.seq_len - r.cached_len for r in reqs], dtype=np.int32)
            ids = [t for r in reqs for t in (r.prompt_ids + r.output_ids)[r.cached_len :]]
        pages = (seq + cfg.page_size - 1) // cfg.page_size

        qo_indptr = np.zeros(bs + 1, dtype=np.int32)
        qo_indptr[1:] = np.cumsum(q_lens)
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        kv_indptr[1:] = np.cumsum(pages)
        last_page_len = ((seq - 1) % cfg.page_size + 1).astype(np.int32)
        kv_indices = np.concatenate([np.asarray(r.page_ids[:p], dtype=np.int32) for r, p in zip(reqs, pages)])
        block_tables = np.zeros((bs, max(int(pages.max()), 1)), dtype=np.int32)
        for i, (r, p) in enumerate(zip(reqs, pages)):
            block_tables[i, :p] = r.page_ids[:p]
        positions = np.concatenate([np.arange(s - q, s, dtype=np.int64) for s, q in zip(seq, q_lens)])
        slots = np.concatenate(
            [
                np.asarray(r.page_ids, dtype=np.int64)[pos // cfg.page_size] * cfg.page_size + pos % cfg.page_size
                for r, pos in zip(reqs, np.split(positions, np.cumsum(q_lens)[:-1]))
            ]
        )

        if ids_staging is not None:
            ids_host = ids_staging[: len(ids)]
            ids_host.copy_(torch.tensor(ids, dtype=torch.int64))
        else:
            ids_host = torch.tensor(ids, dtype=torch.int64).pin_memory()

        seq_lens_cpu = torch.from_numpy(seq).pin_memory()
        qo_indptr_cpu = torch.from_numpy(qo_indptr).pin_memory()
        kv_indptr_cpu = torch.from_numpy(kv_indptr).pin_memory()
        last_cpu = torch.from_numpy(last_page_len).pin_memory()
        temps = torch.tensor([r.temperature for r in reqs], dtype=torch.float32).pin_memory()

        def up(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return cls(
            forward_mode=mode,
            batch_size=bs,
            is_decode=mode == ForwardMode.DECODE,
            max_seq_len=int(seq.max()),
            req_ids=[r.rid for r in reqs],
            input_ids=up(ids_host),
            positions=up(torch.from_numpy(positions).pin_memory()),
            out_cache_loc=up(torch.from_numpy(slots).pin_memory()),
            seq_lens=up(seq_lens_cpu),
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr=up(qo_indptr_cpu),
            qo_indptr_cpu=qo_indptr_cpu,
            kv_indptr=up(kv_indptr_cpu),
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=up(torch.from_numpy(kv_indices).pin_memory()),
            kv_last_page_len=up(last_cpu),
            kv_last_page_len_cpu=last_cpu,
            block_tables=up(torch.from_numpy(block_tables).pin_memory()),
            temperatures=up(temps),
        )

    @classmethod
    def for_capture(cls, bs: int, bufs: "GraphBuffers") -> "ForwardBatch":
        """The dummy decode batch a graph is recorded with: views of the thread's graph buffers."""
        return cls(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            is_decode=True,
            max_seq_len=1,
            req_ids=list(range(bs)),
            input_ids=bufs.input_ids[:bs],
            positions=bufs.positions[:bs],
            out_cache_loc=bufs.out_cache_loc[:bs],
            seq_lens=bufs.seq_lens[:bs],
            seq_lens_cpu=bufs.seq_lens_host[:bs],
            qo_indptr=bufs.qo_indptr[: bs + 1],
            qo_indptr_cpu=bufs.qo_indptr_host[: bs + 1],
            kv_indptr=bufs.kv_indptr[: bs + 1],
            kv_indptr_cpu=bufs.kv_indptr_host[: bs + 1],
            kv_indices=bufs.kv_indices,
            kv_last_page_len=bufs.kv_last_page_len[:bs],
            kv_last_page_len_cpu=bufs.kv_last_page_len_host[:bs],
            block_tables=bufs.block_tables[:bs],
            temperatures=bufs.temperatures[:bs],
        )
