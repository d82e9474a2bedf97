"""The structured-output engine: prefill, decode (graph or eager), masked sampling, jump-forward extends."""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Deque, Dict, List

import numpy as np
import torch

from gbserve.backend import DecodeBatch, GBAttnBackend, PrefillBatch, TrtllmDecode
from gbserve.config import GBConfig
from gbserve.grammar.matcher_pool import GrammarMatcherPool, JumpForward
from gbserve.graph import DecodeGraph, GBDecoder, make_decode_step, make_extend_step
from gbserve.sampler import BitmaskSampler

logger = logging.getLogger(__name__)


@dataclass
class GenRequest:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    temperature: float = 0.0
    grammar_key: str = ""
    pages: List[int] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)
    num_cached: int = 0

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class StructuredEngine:
    def __init__(self, cfg: GBConfig, tokenizer, tokenizer_info, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.backend = GBAttnBackend(cfg, self.device)
        self.model = GBDecoder(cfg).to(self.device)
        self.graph = DecodeGraph(self.model, self.backend, cfg)
        self.sampler = BitmaskSampler(cfg, self.device)
        self.pool = GrammarMatcherPool(tokenizer_info)
        self.jf = JumpForward(tokenizer, self.pool, cfg.max_jump_tokens)
        self.eager_decode = make_decode_step(self.backend.eager_decode_wrapper, self.model, self.backend)
        self.eager_extend = make_extend_step(self.backend.jump_prefill_wrapper, self.model, self.backend)
        self.free_pages: List[int] = list(range(cfg.num_pages))
        self.waiting: Deque[GenRequest] = collections.deque()
        self.running: List[GenRequest] = []
        self.next_ids_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        logger.info("token bitmask backend: %s", self.sampler._backend)  # ok: FC103

    def add_request(self, req: GenRequest, json_schema: str = "") -> None:
        if json_schema:
            self.pool.compile(req.grammar_key, json_schema)
            self.pool.add(req.rid, req.grammar_key)
        self.waiting.append(req)

    # ------------------------------------------------------------------ host bookkeeping

    def _grow(self, req: GenRequest, new_tokens: int) -> None:
        need = -(-(req.num_cached + new_tokens) // self.cfg.page_size) - len(req.pages)
        if need > len(self.free_pages):
            raise RuntimeError("out of KV pages")
        for _ in range(max(need, 0)):
            req.pages.append(self.free_pages.pop())

    def _paged(self, reqs: List[GenRequest], new_lens: List[int]):
        ps = self.cfg.page_size
        for req, n in zip(reqs, new_lens):
            self._grow(req, n)
        seq = np.asarray([r.num_cached + n for r, n in zip(reqs, new_lens)], dtype=np.int32)
        counts = np.asarray([len(r.pages) for r in reqs], dtype=np.int32)
        indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.asarray([p for r in reqs for p in r.pages], dtype=np.int32)
        width = int(counts.max())
        tables = np.zeros((len(reqs), width), dtype=np.int32)
        for i, r in enumerate(reqs):
            tables[i, : len(r.pages)] = r.pages
        slots = []
        for r, n in zip(reqs, new_lens):
            pos = np.arange(r.num_cached, r.num_cached + n)
            slots.append(np.asarray(r.pages, dtype=np.int64)[pos // ps] * ps + pos % ps)
        return seq, indptr, indices, ((seq - 1) % ps + 1).astype(np.int32), np.concatenate(slots), tables

    def _decode_batch(self, reqs: List[GenRequest]) -> DecodeBatch:
        seq, indptr, indices, last, slots, tables = self._paged(reqs, [1] * len(reqs))
        return DecodeBatch(len(reqs), seq, indptr, indices, last, slots, tables)

    def _retire(self, reqs: List[GenRequest]) -> None:
        for req in reqs:
            matcher = self.pool.matchers.get(req.rid)
            done = len(req.output_ids) >= req.max_new_tokens or (matcher is not None and matcher.is_terminated())
            if done:
                self.running.remove(req)
                self.pool.remove(req.rid)
                self.free_pages.extend(req.pages)
                req.pages = []

    # ------------------------------------------------------------------ steps

    def _prefill_step(self) -> int:
        reqs: List[GenRequest] = []
        budget = self.cfg.max_prefill_tokens
        while self.waiting and len(self.waiting[0].prompt_ids) <= budget and len(reqs) < self.cfg.max_batch_size:
            req = self.waiting.popleft()
            budget -= len(req.prompt_ids)
            reqs.append(req)
        lens = [len(r.prompt_ids) for r in reqs]
        seq, indptr, indices, last, slots, tables = self._paged(reqs, lens)
        batch = PrefillBatch(len(reqs), np.asarray(lens, dtype=np.int32), seq, indptr, indices, last, slots, tables)
        self.backend.plan_prefill(batch)
        ids = torch.tensor([t for r in reqs for t in r.prompt_ids], dtype=torch.int64).to(self.device, non_blocking=True)
        pos = torch.from_numpy(np.concatenate([np.arange(n) for n in lens])).to(self.device, non_blocking=True)
        last_idx = torch.from_numpy(np.cumsum(lens) - 1).to(self.device, non_blocking=True)
        logits = self.model.prefill(ids, pos, last_idx, self.backend, batch)
        rids = [r.rid for r in reqs]
        constrained = self.pool.fill_bitmask(rids, self.sampler.bitmask_cpu[: len(reqs)])
        next_ids = self.sampler.sample(logits, rids, constrained, masked_in_graph=False)
        self.next_ids_cpu[: len(reqs)].copy_(next_ids)  # expect: FC101
        for i, req in enumerate(reqs):
            req.num_cached = len(req.prompt_ids)
            req.output_ids.append(int(self.next_ids_cpu[i]))
            self.pool.accept(req.rid, req.output_ids[-1])
        self.running.extend(reqs)
        return len(reqs)

    def _jump_extend(self, reqs: List[GenRequest], jumps: Dict[int, List[int]]) -> None:
        lens = [len(jumps[r.rid]) + 1 for r in reqs]  # the sampled token and the forced ones
        seq, indptr, indices, last, slots, tables = self._paged(reqs, lens)
        batch = PrefillBatch(len(reqs), np.asarray(lens, dtype=np.int32), seq, indptr, indices, last, slots, tables)
        self.backend.plan_jump_extend(batch)
        toks = [t for r, n in zip(reqs, lens) for t in r.output_ids[-n:]]
        pos = np.concatenate([np.arange(r.num_cached, r.num_cached + n) for r, n in zip(reqs, lens)])
        self.eager_extend(
            torch.tensor(toks, dtype=torch.int64).to(self.device, non_blocking=True),
            torch.from_numpy(pos).to(self.device, non_blocking=True),
            torch.from_numpy(np.cumsum(lens) - 1).to(self.device, non_blocking=True),
        )
        for req, n in zip(reqs, lens):
            req.num_cached += n

    def step(self) -> int:
        if self.waiting:
            return self._prefill_step()
        if not self.running:
            return 0
        reqs = self.running[: self.cfg.max_batch_size]
        bs = len(reqs)
        rids = [r.rid for r in reqs]
        batch = self._decode_batch(reqs)
        constrained = self.pool.fill_bitmask(rids, self.sampler.bitmask_cpu[:bs])
        for i, req in enumerate(reqs):
            self.sampler.temperature_cpu[i] = req.temperature
        ids = torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True)
        pos = torch.from_numpy(batch.seq_lens_np - 1).to(self.device, non_blocking=True)
        in_graph = bs <= self.graph.max_bucket
        if in_graph:
            logits = self.graph.replay(batch, ids, pos, self.sampler.bitmask_cpu[:bs])
        else:
            self.backend.plan_eager_decode(batch)
            if self.cfg.use_trtllm:
                logits = make_decode_step(TrtllmDecode(self.backend, batch), self.model, self.backend)(ids, pos, None)
            else:
                logits = self.eager_decode(ids, pos, None)

        next_ids = self.sampler.sample(logits, rids, constrained, masked_in_graph=in_graph)
        self.next_ids_cpu[:bs].copy_(next_ids, non_blocking=True)
        tokens = self.next_ids_cpu[:bs].tolist()  # expect: FC101
        jumps = self.sampler.jump_forward(next_ids, rids, self.pool, self.jf)
        for row, req in enumerate(reqs):
            req.num_cached += 1
            req.output_ids.append(tokens[row])
            forced = jumps.get(req.rid)
            if forced:
                req.output_ids.extend(forced)
                # the extend below writes the forced tokens' KV; let the next replay see the longer last page
                self.backend.kv_last_page_len[row].add_(len(forced))  # expect: FC104
        if jumps:
            self._jump_extend([r for r in reqs if r.rid in jumps], jumps)
        self._retire(reqs)
        return bs

    def dump_state(self) -> None:
        """Debugging aid for the admin endpoint."""
        print(f"running={len(self.running)} bitmask rows: {self.graph.static_bitmask}")  # ok: FC101
