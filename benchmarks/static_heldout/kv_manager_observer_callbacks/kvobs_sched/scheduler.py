"""Host scheduler: admits requests, asks the block manager for pages, builds the per-step ForwardBatch."""
import enum
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from kvobs.block_manager import BlockManager
from kvobs.config import PAGE_SIZE, ServerConfig


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class Req:
    rid: str
    input_ids: List[int]
    max_new_tokens: int = 128
    output_ids: List[int] = field(default_factory=list)
    row: int = -1

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    rids: List[str]
    rows: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    block_tables: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    win_kv_indptr: Optional[torch.Tensor] = None
    token_rows: Optional[torch.Tensor] = None


class Scheduler:
    def __init__(self, cfg: ServerConfig, bm: BlockManager, device: torch.device):
        self.cfg, self.bm, self.device = cfg, bm, device
        self.waiting: List[Req] = []
        self.running: List[Req] = []
        self.free_rows = list(range(cfg.max_running))

    def add_request(self, req: Req) -> None:
        assert len(req.input_ids) < self.cfg.max_context  # expect: FC109
        self.waiting.append(req)

    def next_batch(self) -> Optional[ForwardBatch]:
        admitted = [self.waiting.pop(0) for _ in range(min(len(self.waiting), len(self.free_rows)))]
        for req in admitted:
            req.row = self.free_rows.pop()
        self.running += admitted
        reqs = admitted or self.running
        return self._build(reqs, ForwardMode.EXTEND if admitted else ForwardMode.DECODE) if reqs else None

    def _build(self, reqs: List[Req], mode: ForwardMode) -> ForwardBatch:
        toks = [r.input_ids if mode == ForwardMode.EXTEND else r.output_ids[-1:] for r in reqs]
        seq = np.array([r.seq_len for r in reqs], dtype=np.int32)
        ext = np.array([len(t) for t in toks], dtype=np.int32)
        pages = [self.bm.ensure(r.rid, r.seq_len) for r in reqs]
        qo, kv = np.zeros(len(reqs) + 1, dtype=np.int32), np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(ext, out=qo[1:])
        np.cumsum([len(p) for p in pages], out=kv[1:])
        last = (seq - 1) % PAGE_SIZE + 1
        pos = np.concatenate([np.arange(s - e, s) for s, e in zip(seq, ext)])
        tables = np.zeros((len(reqs), max(len(p) for p in pages)), dtype=np.int32)
        for i, p in enumerate(pages):
            tables[i, : len(p)] = p

        def dev(a) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=True)

        return ForwardBatch(
            mode, len(reqs), [r.rid for r in reqs], dev(np.array([r.row for r in reqs], dtype=np.int32)),
            dev(np.concatenate(toks).astype(np.int64)), dev(pos.astype(np.int64)), dev(seq), dev(ext), dev(qo), dev(kv),
            dev(np.concatenate(pages).astype(np.int32)), dev(last), dev(tables), torch.from_numpy(seq), torch.from_numpy(ext),
            torch.from_numpy(qo), torch.from_numpy(kv), torch.from_numpy(last))

    def finish(self, req: Req, aborted: bool = False) -> None:
        self.running.remove(req)
        self.free_rows.append(req.row)
        if aborted:
            self.bm.abort(req.rid, req.row)
        else:
            self.bm.free(req.rid)
