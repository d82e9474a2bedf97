"""The step: build the batch, plan every group, run eagerly or replay a bucket."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from lg_runtime.graph_runner import GroupGraphRunner
from lg_runtime.metadata import GroupBatch
from lg_runtime.model import GroupedModel
from lg_runtime.planner import LayerGroupPlanner
from lgroups.kv_pool import GroupKVPool
from lgroups.spec import ModelGroupsConfig


@dataclass
class RunningReq:
    rid: int
    seq_len: int                       # tokens in the KV after this step
    new_tokens: List[int]
    pages: Dict[int, List[int]]        # group -> page ids in that group's pool


class GroupedModelRunner:
    def __init__(self, cfg: ModelGroupsConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.pools = [GroupKVPool(spec, device) for spec in cfg.groups]
        self.planner = LayerGroupPlanner(cfg, self.pools, device)
        self.model = GroupedModel(cfg, self.pools).to(device=device, dtype=torch.bfloat16)
        self.graphs = GroupGraphRunner(self.model, self.planner, cfg, device)
        self.eos_id = cfg.eos_token_id
        self._sample_buf: Optional[torch.Tensor] = None
        self._last_bucket = -1
        self._finish_pending = False

    def grow_pages(self, reqs: List[RunningReq]) -> bool:
        """Give every request the pages its new tokens need in each group; True if any page was added."""
        crossed = False
        for r in reqs:
            for g, pool in enumerate(self.pools):
                need = -(-r.seq_len // pool.spec.page_size) - len(r.pages[g])
                if need > 0:
                    r.pages[g].extend(pool.alloc(need))
                    crossed = True
        return crossed

    def make_batch(self, reqs: List[RunningReq]) -> GroupBatch:
        n = len(reqs)
        q_lens_np = np.array([len(r.new_tokens) for r in reqs], dtype=np.int64)
        seq_lens_np = np.array([r.seq_len for r in reqs], dtype=np.int64)
        qo_indptr_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(q_lens_np, out=qo_indptr_np[1:])
        ids = np.concatenate([np.asarray(r.new_tokens, dtype=np.int64) for r in reqs])
        pos = np.concatenate([np.arange(r.seq_len - len(r.new_tokens), r.seq_len) for r in reqs])
        dev = self.device
        req_pages = {g: [np.asarray(r.pages[g], dtype=np.int32) for r in reqs] for g in range(len(self.pools))}
        block_tables = {}
        for g, rows in req_pages.items():
            width = max(len(p) for p in rows)
            table = np.zeros((n, width), dtype=np.int32)
            for i, p in enumerate(rows):
                table[i, : len(p)] = p
            block_tables[g] = torch.from_numpy(table).to(dev, non_blocking=True)
        qo_indptr_cpu = torch.from_numpy(qo_indptr_np)
        return GroupBatch(
            num_reqs=n,
            num_tokens=int(qo_indptr_np[-1]),
            is_decode=bool((q_lens_np == 1).all()),
            input_ids=torch.from_numpy(ids).to(dev, non_blocking=True),
            positions=torch.from_numpy(pos).to(dev, non_blocking=True),
            q_lens=torch.from_numpy(q_lens_np).to(dev, non_blocking=True),
            qo_indptr=qo_indptr_cpu.to(dev, non_blocking=True),
            qo_indptr_cpu=qo_indptr_cpu,
            seq_lens=torch.from_numpy(seq_lens_np).to(dev, non_blocking=True),
            seq_lens_np=seq_lens_np,
            req_pages=req_pages,
            block_tables=block_tables,
        )

    def execute_step(self, reqs: List[RunningReq]) -> torch.Tensor:
        crossed = self.grow_pages(reqs)
        batch = self.make_batch(reqs)
        batch.no_page_crossed = not crossed
        n = batch.num_reqs
        if batch.is_decode and n <= self.graphs.max_bs:
            bs = self.graphs.bucket(n)
            if batch.no_page_crossed and self._last_bucket == bs:
                # same pages as the last step: only the last page of each request grew
                for g in self.planner.local_ids:
                    bufs = self.planner.graph_bufs[g]
                    torch.add(bufs.kv_last_page_len[:n], 1, out=bufs.kv_last_page_len[:n])  # expect: FC104
                logits = self.graphs.replay_same_plan(batch)
            else:
                logits = self.graphs.replay(batch)
            self._last_bucket = bs
        else:
            meta = self.planner.plan_step(batch)
            logits = self.model(batch.input_ids, batch.positions, meta)
            self._last_bucket = -1
        if getattr(self, "_sample_buf", None) is None:
            self._sample_buf = torch.empty(self.cfg.max_tokens, dtype=torch.int64, device=self.device)  # ok: FC107
        last = torch.from_numpy(np.cumsum([len(r.new_tokens) for r in reqs]) - 1).to(self.device, non_blocking=True)
        next_tokens = torch.argmax(logits[last], dim=-1, out=self._sample_buf[:n])
        if (next_tokens == self.eos_id).any():  # expect: FC101
            self._finish_pending = True
        return next_tokens
