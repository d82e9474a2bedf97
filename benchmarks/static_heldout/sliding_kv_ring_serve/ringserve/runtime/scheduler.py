"""FCFS scheduler that builds decode and prompt batches on the host."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import numpy as np
import torch

from ringserve.attn.base import ForwardBatch
from ringserve.config import RingConfig
from ringserve.ring.ring_cache import RingKVCache
from ringserve.utils import ring_window_positions


@dataclass
class Request:
    rid: str
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = field(default_factory=list)
    slot: int = -1


class RingScheduler:
    def __init__(self, cfg: RingConfig, cache: RingKVCache, device: torch.device):
        self.cfg = cfg
        self.cache = cache
        self.device = device
        self.waiting: Deque[Request] = collections.deque()
        self.running: Dict[int, Request] = {}

    def admit(self, req: Request) -> None:
        self.waiting.append(req)

    def _dev(self, arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(arr, dtype=dtype).to(self.device, non_blocking=True)

    def next_extend_batch(self) -> Optional[ForwardBatch]:
        reqs: List[Request] = []
        budget = self.cfg.max_num_tokens
        # prompts longer than the window are chunked by the front end before they get here
        while self.waiting and len(self.waiting[0].prompt_ids) <= min(budget, self.cfg.window):
            req = self.waiting.popleft()
            budget -= len(req.prompt_ids)
            req.slot = self.cache.add_request(req.rid, len(req.prompt_ids))
            self.running[req.slot] = req
            reqs.append(req)
        if not reqs:
            return None
        lens_np = np.array([len(r.prompt_ids) for r in reqs], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(lens_np)]).astype(np.int32)
        # every prompt fits the window, so its window positions are 0..len-1 (host)
        pos_cpu = ring_window_positions(torch.tensor(lens_np, dtype=torch.int32), self.cfg.window)
        pos_cpu = torch.cat([pos_cpu[i, : int(lens_np[i])] for i in range(len(reqs))])
        ps, wp = self.cfg.page_size, self.cfg.window_pages
        out_loc_np = np.concatenate([
            self.cache.ring_pages_np[r.slot, (np.arange(n) // ps) % wp].astype(np.int64) * ps + np.arange(n) % ps
            for r, n in zip(reqs, lens_np)
        ])
        slots_np = np.array([r.slot for r in reqs], dtype=np.int64)
        ids = np.concatenate([np.asarray(r.prompt_ids, dtype=np.int64) for r in reqs])
        return ForwardBatch(
            mode="extend", batch_size=len(reqs), request_ids=[r.rid for r in reqs], slots_np=slots_np,
            seq_lens_np=lens_np, slots_gpu=self._dev(slots_np, torch.int64), seq_lens_gpu=self._dev(lens_np, torch.int32),
            input_ids_gpu=self._dev(ids, torch.int64), positions_gpu=pos_cpu.to(self.device, non_blocking=True),
            extend_indptr_np=indptr, out_loc_gpu=self._dev(out_loc_np, torch.int64),
        )

    def next_decode_batch(self) -> Optional[ForwardBatch]:
        if not self.running:
            return None
        cfg = self.cfg
        slots_np = np.fromiter(self.running.keys(), dtype=np.int64)
        reqs = [self.running[int(s)] for s in slots_np]
        lens_np = self.cache.seq_lens_np[slots_np] + 1
        used_np = np.minimum(-(-lens_np // cfg.page_size), cfg.window_pages)
        heads_np = ((lens_np - 1) // cfg.page_size) % cfg.window_pages
        runs = [self.cache.global_runs[int(s)] for s in slots_np]
        out_loc_np = self.cache.ring_pages_np[slots_np, heads_np].astype(np.int64) * cfg.page_size + (lens_np - 1) % cfg.page_size
        tokens_np = np.array([(r.output_ids or r.prompt_ids)[-1] for r in reqs], dtype=np.int64)
        return ForwardBatch(
            mode="decode", batch_size=len(reqs), request_ids=[r.rid for r in reqs], slots_np=slots_np,
            seq_lens_np=lens_np, slots_gpu=self._dev(slots_np, torch.int64), seq_lens_gpu=self._dev(lens_np, torch.int32),
            input_ids_gpu=self._dev(tokens_np, torch.int64), heads_gpu=self._dev(heads_np, torch.int64),
            valid_pages_gpu=self._dev(used_np, torch.int64),
            last_page_len_cpu=torch.tensor((lens_np - 1) % cfg.page_size + 1, dtype=torch.int32, pin_memory=True),
            block_tables_gpu=self._dev(self.cache.ring_pages_np[slots_np], torch.int32),
            global_pages_np=np.array([len(r) for r in runs], dtype=np.int32),
            global_indices_gpu=self._dev(np.concatenate([np.asarray(r, dtype=np.int32) for r in runs]), torch.int32),
            max_seq_len=int(lens_np.max()),
            all_rings_full=bool(np.all(used_np == cfg.window_pages)),
            crossed_page=bool(np.any((lens_np - 1) % cfg.page_size == 0)),
            out_loc_gpu=self._dev(out_loc_np, torch.int64),
        )

    def on_tokens(self, request_ids: List[str], tokens: List[int]) -> None:
        by_rid = {r.rid: r for r in self.running.values()}
        for rid, tok in zip(request_ids, tokens):
            req = by_rid[rid]
            req.output_ids.append(tok)
            if tok == self.cfg.eos_token_id or len(req.output_ids) >= req.max_new_tokens:
                del self.running[req.slot]
                self.cache.release(req.slot)
