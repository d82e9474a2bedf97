"""A continuous-batching scheduler whose queues survive a restart."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from warmstart.config import RestartConfig
from warmstart.forward_batch import ForwardBatch, ForwardMode
from warmstart.kv.pool import PagedKVPool, ReqToPageTable


@dataclass
class Req:
    rid: str
    prompt: List[int]
    output: List[int] = field(default_factory=list)
    row: int = -1
    seq_len: int = 0
    restore_gen: int = 0
    max_new_tokens: int = 512

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]


class Scheduler:
    def __init__(self, cfg: RestartConfig, pool: PagedKVPool, req_to_page: ReqToPageTable, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.req_to_page = req_to_page
        self.device = device
        self.waiting: List[Req] = []
        self.running: List[Req] = []
        self.generation = 0

    # -- snapshot state ----------------------------------------------------------------------

    def request_rows(self) -> Dict[str, List[int]]:
        return {r.rid: [r.row, r.seq_len, (r.seq_len - 1) % self.cfg.page_size + 1] for r in self.running}

    def to_state(self) -> Dict[str, object]:
        return {
            "waiting": [{"rid": r.rid, "prompt": r.prompt, "max_new": r.max_new_tokens} for r in self.waiting],
            "running": [
                {"rid": r.rid, "prompt": r.prompt, "output": r.output, "row": r.row, "seq_len": r.seq_len}
                for r in self.running
            ],
        }

    def from_state(self, state: Dict[str, object], generation: int) -> None:
        self.generation = generation
        self.waiting = [Req(d["rid"], d["prompt"], max_new_tokens=d["max_new"]) for d in state["waiting"]]
        self.running = [
            Req(d["rid"], d["prompt"], d["output"], d["row"], d["seq_len"], restore_gen=generation)
            for d in state["running"]
        ]
        taken = {r.row for r in self.running}
        self.req_to_page.free_rows = [i for i in self.req_to_page.free_rows if i not in taken]

    # -- batches -----------------------------------------------------------------------------

    def next_decode_batch(self) -> Optional[ForwardBatch]:
        reqs = self.running
        if not reqs:
            return None
        bs = len(reqs)
        for r in reqs:
            r.seq_len += 1
        rows = [r.row for r in reqs]
        lens = [r.seq_len for r in reqs]
        P = self.cfg.page_size
        locs = [int(self.req_to_page.table_np[r.row, (r.seq_len - 1) // P]) * P + (r.seq_len - 1) % P for r in reqs]
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=self.device),
            positions=torch.tensor([n - 1 for n in lens], dtype=torch.int64, device=self.device),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=self.device),
            req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64).pin_memory(),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int32).pin_memory(),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64, device=self.device),
            restore_gen=torch.tensor([r.restore_gen for r in reqs], dtype=torch.int32, device=self.device),
        )

    def next_extend_batch(self, reqs: List[Req]) -> ForwardBatch:
        qo = [0]
        for r in reqs:
            qo.append(qo[-1] + len(r.prompt))
        rows = [r.row for r in reqs]
        lens = [len(r.prompt) for r in reqs]
        P = self.cfg.page_size
        locs = [int(self.req_to_page.table_np[r.row, i // P]) * P + i % P for r in reqs for i in range(len(r.prompt))]
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(reqs),
            input_ids=torch.tensor([t for r in reqs for t in r.prompt], dtype=torch.int64, device=self.device),
            positions=torch.tensor([i for n in lens for i in range(n)], dtype=torch.int64, device=self.device),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=self.device),
            req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64).pin_memory(),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int32).pin_memory(),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64, device=self.device),
            restore_gen=torch.full((len(reqs),), self.generation, dtype=torch.int32, device=self.device),
            extend_qo_indptr=torch.tensor(qo, dtype=torch.int32, device=self.device),
        )

    def process_decode(self, next_ids: torch.Tensor) -> None:
        for r, tok in zip(self.running, next_ids.tolist()):
            r.output.append(tok)
        self.running = [r for r in self.running if len(r.output) < r.max_new_tokens]
