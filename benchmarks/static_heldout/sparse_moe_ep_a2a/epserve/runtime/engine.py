"""The decode loop of one expert-parallel rank, with an output thread that reads sampled tokens."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from epserve.config import EPConfig
from epserve.dist.a2a import AllToAllDispatcher
from epserve.layers import MicroBatchAttnBackend
from epserve.model import EPModel, MLAKVPool
from epserve.runtime.graph_runner import EPGraphRunner
from epserve.runtime.tbo import TwoBatchSplitter


@dataclass
class Request:
    rid: int
    row: int
    kv_len: int
    last_token: int
    max_new_tokens: int
    generated: int = 0
    done: bool = False


class EPEngine:
    def __init__(self, cfg: EPConfig, rank: int, num_pages: int, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.backend = MicroBatchAttnBackend(cfg, device)
        self.attn = self.backend
        self.dispatcher = AllToAllDispatcher(
            cfg.num_experts, cfg.top_k, cfg.ep_size, rank, cfg.capacity_factor, cfg.max_prefill_tokens, device
        )
        self.kv_pool = MLAKVPool(cfg, num_pages, device)
        self.model = EPModel(cfg, self.backend, self.kv_pool, self.dispatcher, device)
        self.splitter = TwoBatchSplitter(self.backend, cfg, device)
        self.runner = EPGraphRunner(self.model, self.backend, self.splitter, cfg, device)
        self.page_table_np = np.zeros((cfg.max_batch_size, cfg.max_pages() // cfg.max_batch_size), dtype=np.int32)
        self.block_tables = torch.zeros(self.page_table_np.shape, dtype=torch.int32, device=device)
        self.tokens_pinned = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.output_queue: "queue.Queue[Tuple[torch.cuda.Event, List[int]]]" = queue.Queue()
        self.finished_rows: "queue.Queue[int]" = queue.Queue()
        self.pending_ep_resize: Optional[Tuple[int, Optional[dist.ProcessGroup]]] = None
        self.running: List[Request] = []
        self.cuda_graphs = True
        self._out_thread = threading.Thread(target=self._output_loop, daemon=True)
        self._out_thread.start()

    def _output_loop(self) -> None:
        while True:
            event, rids = self.output_queue.get()
            event.synchronize()
            toks = self.tokens_pinned[: len(rids)].tolist()
            for i, (rid, tok) in enumerate(zip(rids, toks)):
                req = next((r for r in self.running if r.rid == rid), None)
                if req is None:
                    continue
                req.last_token = tok
                req.generated += 1
                if req.generated >= req.max_new_tokens:
                    req.done = True
                    self.finished_rows.put(i)

    def _drain_finished(self) -> List[int]:
        rows = []
        while not self.finished_rows.empty():
            rows.append(self.finished_rows.get_nowait())
        return rows

    def forward_step(self, batch: List[Request]) -> None:
        bs = len(batch)
        if self.pending_ep_resize is not None:
            new_size, group = self.pending_ep_resize
            self.dispatcher.resize_group(new_size, group)
            self.pending_ep_resize = None
        kv_lens_np = np.array([r.kv_len + 1 for r in batch], dtype=np.int64)
        rows = np.array([r.row for r in batch], dtype=np.int64)
        metas = self.splitter.split(kv_lens_np, self.page_table_np[rows], self.block_tables[torch.from_numpy(rows).to(self.device)])
        input_ids = torch.tensor([r.last_token for r in batch], dtype=torch.int64).to(self.device, non_blocking=True)
        positions = torch.from_numpy(kv_lens_np - 1).to(self.device, non_blocking=True)
        if self.cuda_graphs and all(m.bucket > 0 for m in metas):
            logits = self.runner.replay(input_ids, positions, metas, bs)
        else:
            for m in metas:
                self.backend.plan_eager(m)
                if m.has_long_rows:
                    self.backend.plan_long_rows(m)
            logits = self.model.forward_decode(input_ids, positions, metas)
        next_tokens = logits.argmax(dim=-1)
        self.tokens_pinned[:bs].copy_(next_tokens, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.output_queue.put((event, [r.rid for r in batch]))
        for r in batch:
            r.kv_len += 1
        # rows the output thread saw finish last step: zero their lengths so the graphs skip them
        finished_rows = self._drain_finished()
        if finished_rows:
            bufs = self.attn.graph_bufs
            bufs["kv_len_arr"][0, finished_rows] = 0  # expect: FC104

    def metrics(self) -> dict:
        return {"expert_load": self.dispatcher.report_expert_load(), "running": len(self.running)}
