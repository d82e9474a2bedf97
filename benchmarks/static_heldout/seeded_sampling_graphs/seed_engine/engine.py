"""The seeded serving engine: graphs for plain decode, eager steps for logprobs."""

from __future__ import annotations

import collections
import random
from typing import Deque, List, Optional

import flashcheck
import numpy as np
import torch

from seed_attn.backend import SeededAttnBackend
from seed_attn.graphs import DecodeGraphs
from seed_attn.model import PrefillInputs, SeedDecoder
from seedserve.batch import DecodeBatch
from seedserve.config import ServeConfig
from seedserve.kv import PagedKV
from seedserve.params import Request, SamplingParams
from seedserve.rng import SeedTable
from seedserve.sampler import EagerLogprobSampler, GraphSampler

from .outputs import OutputDrain


class SeededEngine:
    def __init__(self, cfg: ServeConfig, device: str = "cuda", use_graphs: bool = True):
        self.cfg = cfg
        self.device = torch.device(device)
        self.kv = PagedKV(cfg, self.device)
        self.backend = SeededAttnBackend(cfg, self.kv, self.device)
        self.model = SeedDecoder(cfg, self.backend).to(self.device)
        self.seed_table = SeedTable(2 * cfg.max_batch_size, self.device)
        self.sampler = GraphSampler(cfg.vocab_size, self.device)
        self.eager_sampler = EagerLogprobSampler(cfg.max_batch_size, cfg.max_logprobs, self.device)
        self.graphs: Optional[DecodeGraphs] = None
        if use_graphs:
            self.graphs = DecodeGraphs(cfg, self.model, self.backend, self.seed_table, self.sampler, self.device)
            self.graphs.capture_all()
        self.outputs = OutputDrain(cfg.max_batch_size)
        self.waiting: Deque[Request] = collections.deque()
        self.running: List[Request] = []
        self._free_slots: List[int] = []
        self._next_slot = 1  # slot 0 is the padded rows' scratch slot
        self._next_rid = 0
        self._host_rng = random.Random(0xC0FFEE)

    # ------------------------------------------------------------ admission
    def add_request(self, prompt_ids: List[int], params: SamplingParams, n: int = 1) -> List[int]:
        assert params.seed is None or 0 <= params.seed < 2**62, "seed must fit in 62 bits"  # expect: FC109
        if params.logprobs > self.cfg.max_logprobs:
            raise ValueError(f"logprobs={params.logprobs} > max_logprobs={self.cfg.max_logprobs}")
        group = self._next_rid if n > 1 else -1
        rids = []
        for i in range(n):
            p = SamplingParams(**{**params.__dict__, "seed": None if params.seed is None else params.seed + i})
            self.waiting.append(Request(rid=self._next_rid, prompt_ids=list(prompt_ids), params=p, group=group))
            rids.append(self._next_rid)
            self._next_rid += 1
        return rids

    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        slot = self._next_slot
        self._next_slot += 1
        self.seed_table.ensure_capacity(slot)
        return slot

    def _admit(self) -> None:
        new: List[Request] = []
        while self.waiting and len(self.running) + len(new) < self.cfg.max_batch_size:
            req = self.waiting[0]
            if not self.kv.grow(req, req.seq_len + 1):
                break
            self.waiting.popleft()
            req.slot = self._take_slot()
            new.append(req)
        if not new:
            return
        slots = np.array([r.slot for r in new], dtype=np.int64)
        seeds = np.array(
            [r.params.seed if r.params.seed is not None else self._host_rng.getrandbits(62) for r in new],
            dtype=np.int64,
        )
        offsets = np.array([r.philox_offset for r in new], dtype=np.int64)
        self.seed_table.stage(slots, seeds, offsets)
        self._prefill(new)
        self.running.extend(new)

    def _prefill(self, reqs: List[Request]) -> None:
        toks = [r.prompt_ids + r.output_ids for r in reqs]
        lens = np.array([len(t) for t in toks], dtype=np.int32)
        qo = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(lens, out=qo[1:])
        kv_indptr, kv_indices, last = self.kv.csr(reqs, lens)
        indices = torch.from_numpy(kv_indices).to(self.device, non_blocking=True)
        self.backend.plan_prefill(qo, kv_indptr, indices, last)
        pf = PrefillInputs(
            input_ids=torch.from_numpy(np.concatenate([np.asarray(t, dtype=np.int64) for t in toks])).to(self.device),
            positions=torch.from_numpy(np.concatenate([np.arange(n) for n in lens]).astype(np.int32)).to(self.device),
            batch_indices=torch.from_numpy(np.repeat(np.arange(len(reqs), dtype=np.int32), lens)).to(self.device),
            kv_indptr=torch.from_numpy(kv_indptr).to(self.device),
            kv_indices=indices,
            kv_last_page_len=torch.from_numpy(last).to(self.device),
            last_rows=torch.from_numpy(qo[1:].astype(np.int64) - 1).to(self.device),
        )
        logits = self.model.forward_prefill(pf)
        slots = torch.from_numpy(np.array([r.slot for r in reqs], dtype=np.int64)).to(self.device)
        temps = torch.from_numpy(np.array([r.params.temperature for r in reqs], dtype=np.float32)).to(self.device)
        seeded = torch.ones(len(reqs), dtype=torch.bool, device=self.device)
        offsets = self.seed_table.offsets[slots]
        ids = self.sampler.sample(logits, temps, self.seed_table.seeds[slots], offsets, seeded)
        self.seed_table.offsets.index_copy_(0, slots, offsets)
        self.seed_table.set_last_tokens(slots, ids)
        for r in reqs:
            r.num_generated += 1
        self.outputs.push(ids, list(reqs), None)

    # ---------------------------------------------------------------- paging
    def _preempt(self, req: Request) -> None:
        req.philox_offset = int(self.seed_table.offsets_np[req.slot])  # ok: FC101
        self.kv.free(req)
        self.running.remove(req)
        self._free_slots.append(req.slot)
        req.slot = -1
        self.waiting.appendleft(req)

    def _ensure_pages(self) -> None:
        for req in sorted(self.running, key=lambda r: -r.rid):
            if not self.kv.grow(req, req.seq_len):
                self._preempt(req)

    def _reap_finished(self) -> None:
        keep = []
        for req in self.running:
            if req.finished:
                self.kv.free(req)
                self._free_slots.append(req.slot)
            else:
                keep.append(req)
        self.running = keep

    # ------------------------------------------------------------------ step
    def _eager_step(self, fb: DecodeBatch):
        self.backend.init_forward_metadata(fb)
        logits = self.model.forward_decode(self.seed_table.last_token[fb.slots], fb)
        seeds = self.seed_table.seeds[fb.slots]
        offsets = self.seed_table.offsets[fb.slots]
        ids, lps = self.eager_sampler.sample_with_logprobs(logits, fb.temps, seeds, offsets, fb.num_logprobs_np)
        self.seed_table.advance(fb.slots)
        self.seed_table.set_last_tokens(fb.slots, ids)
        return ids, lps

    @flashcheck.hot_path
    def step(self) -> Optional[torch.Tensor]:
        self._reap_finished()
        self._admit()
        self._ensure_pages()
        if not self.running:
            return None
        fb = DecodeBatch.build(self.running, self.kv, self.device)
        bucket = self.graphs.bucket(fb.batch_size) if self.graphs is not None else None
        if fb.needs_logprobs or bucket is None:
            ids, lps = self._eager_step(fb)
        else:
            ids, lps = self.graphs.replay(fb), None
            # keep the device lengths in step with the appended token until the next plan
            self.backend.kv_last_page_len[: fb.batch_size].add_(1)  # expect: FC104
        self.seed_table.snapshot_offsets()
        for req in self.running:
            req.num_generated += 1
        self.outputs.push(ids, list(self.running), lps)
        return ids
