"""The engine: profile at start-up, size the KV cache, capture graphs with what is left, then step."""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import numpy as np
import torch

from memprof.kv_pool import PagedKVPool
from memprof.limits import EngineLimits, WorkspaceSizes
from memprof.profiler import MemoryProfiler
from memprof.workspaces import WorkspacePlanner
from memprof_rt.attn_backend import FlashInferBackend
from memprof_rt.graph_runner import BucketGraphRunner
from memprof_rt.metadata import StepMetadata, make_step_metadata
from memprof_rt.model import TinyDecoder

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = field(default_factory=list)
    pages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    seq_len: int = 0

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]


class ProfiledEngine:
    def __init__(self, limits: EngineLimits, device: str = "cuda") -> None:
        self.limits = limits
        self.device = torch.device(device)
        self.profiler = MemoryProfiler(limits, limits.gpu_memory_utilization, self.device)
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.step_idx = 0
        self.high_watermark_pages = 0
        self.regrow_every = 1024
        self._sample_scratch: Optional[torch.Tensor] = None

    # ---------------------------------------------------------------- start-up

    def start(self) -> None:
        lim = self.limits
        prof = self.profiler
        prof.snapshot_baseline()
        sizes = WorkspaceSizes.from_limits(lim)
        self.workspaces = WorkspacePlanner(sizes, self.device).allocate()
        provisional = PagedKVPool(lim, lim.max_pages_per_seq * 2, self.device)
        self.pool = provisional
        self.backend = FlashInferBackend(lim, self.workspaces, provisional, self.device)
        self.model = TinyDecoder(lim, self.backend).to(self.device, dtype=torch.float16)
        prof.record_weights(self.model)

        peak = prof.profile_forward(self._run_max_prefill)
        peak = max(peak, prof.profile_decode(self.backend, provisional))
        del provisional
        self.pool = None
        self.backend.pool = None
        torch.cuda.empty_cache()

        buckets = [b for b in lim.graph_buckets if b <= lim.max_num_seqs]
        sizing = prof.derive_sizing(peak, self.workspaces.nbytes(), len(buckets))
        logger.info("memory plan: %s", sizing.describe())
        self.pool = PagedKVPool(lim, sizing.num_pages, self.device, max_pages_cap=sizing.num_pages * 5 // 4)
        self.backend.pool = self.pool
        self.high_watermark_pages = int(sizing.num_pages * 0.95)

        self.backend.init_graph_wrappers(buckets)
        self.runner = BucketGraphRunner(self.model, self.backend, lim, self.device)
        captured = self.runner.capture_buckets(sizing.graph_budget_bytes)
        extra = prof.account_wrapper_buffers(self.backend)
        logger.info("captured %s; wrapper int workspaces %d KiB", captured, extra >> 10)

    def _run_max_prefill(self) -> torch.Tensor:
        lim = self.limits
        bs = min(lim.max_num_seqs, lim.max_num_batched_tokens)
        per = lim.max_num_batched_tokens // bs
        pages_per = (per + lim.page_size - 1) // lim.page_size
        table = np.zeros((bs, lim.max_pages_per_seq), dtype=np.int32)
        table[:, :pages_per] = 1 + np.arange(bs * pages_per, dtype=np.int32).reshape(bs, pages_per)
        lens = np.full(bs, per, dtype=np.int32)
        ids = np.zeros(bs * per, dtype=np.int64)
        meta = make_step_metadata(lens, lens, table, ids, lim.page_size, self.device, is_prefill=True)
        self.backend.init_forward_metadata(meta)
        return self.model.forward_extend(meta)

    # -------------------------------------------------------------- scheduling

    def add_request(self, req: Request) -> None:
        if len(req.prompt_ids) + req.max_new_tokens > self.limits.max_model_len:
            raise ValueError(f"request {req.rid} needs more than max_model_len={self.limits.max_model_len} tokens")
        self.waiting.append(req)

    def _admit(self) -> List[Request]:
        lim = self.limits
        admitted: List[Request] = []
        budget = lim.max_num_batched_tokens
        while self.waiting and len(self.running) + len(admitted) < lim.max_num_seqs:
            req = self.waiting[0]
            need = len(req.prompt_ids) // lim.page_size + 1
            if need > self.pool.num_free_host or len(req.prompt_ids) > budget:
                break
            self.waiting.popleft()
            req.pages = self.pool.allocate(need)
            req.seq_len = len(req.prompt_ids)
            budget -= len(req.prompt_ids)
            admitted.append(req)
        return admitted

    def _page_table(self, reqs: List[Request]) -> np.ndarray:
        table = np.zeros((len(reqs), self.limits.max_pages_per_seq), dtype=np.int32)
        for i, r in enumerate(reqs):
            table[i, : r.pages.size] = r.pages
        return table

    def _prefill(self, reqs: List[Request]) -> torch.Tensor:
        lim = self.limits
        lens = np.array([r.seq_len for r in reqs], dtype=np.int32)
        ids = np.concatenate([np.asarray(r.prompt_ids, dtype=np.int64) for r in reqs])
        meta = make_step_metadata(lens, lens, self._page_table(reqs), ids, lim.page_size, self.device, True)
        for r in reqs:
            self.pool.retain_dev(torch.from_numpy(r.pages).to(self.device, non_blocking=True))
        self.backend.init_forward_metadata(meta)
        return self.model.forward_extend(meta)

    def _decode_metadata(self) -> StepMetadata:
        lim = self.limits
        for r in self.running:
            if r.seq_len >= r.pages.size * lim.page_size:
                new_page = self.pool.allocate(1)
                r.pages = np.concatenate([r.pages, new_page])
                self.pool.retain_dev(torch.from_numpy(new_page).to(self.device, non_blocking=True))
            r.seq_len += 1
        lens = np.array([r.seq_len for r in self.running], dtype=np.int32)
        ids = np.array([r.last_token for r in self.running], dtype=np.int64)
        ones = np.ones(len(self.running), dtype=np.int32)
        return make_step_metadata(lens, ones, self._page_table(self.running), ids, lim.page_size, self.device, False)

    def _preempt_last(self) -> None:
        victim = self.running.pop()
        self.pool.drop_dev(torch.from_numpy(victim.pages).to(self.device, non_blocking=True))
        self.pool.release(victim.pages)
        victim.pages = np.zeros(0, dtype=np.int32)
        self.waiting.appendleft(victim)

    def _maybe_grow_kv(self) -> None:
        free, _ = torch.cuda.mem_get_info(self.device)
        spare = free - (2 << 30)
        if spare > 0:
            added = self.pool.grow(spare // self.limits.kv_bytes_per_page)
            self.high_watermark_pages += int(added * 0.95)

    def _use_long_path(self, meta: StepMetadata) -> bool:
        longest_pages = math.ceil(meta.seq_lens.max() / self.limits.page_size)  # expect: FC101
        return longest_pages > self.limits.long_context_pages

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        if self._sample_scratch is None:
            self._sample_scratch = torch.empty(self.limits.max_num_seqs, dtype=torch.int64, device=self.device)  # ok: FC107
        out = self._sample_scratch[: logits.shape[0]]
        torch.argmax(logits, dim=-1, out=out)
        return out

    # ------------------------------------------------------------------- step

    def step(self) -> Optional[torch.Tensor]:
        self.step_idx += 1
        if self.step_idx % self.regrow_every == 0:
            self._maybe_grow_kv()

        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
            self.running.extend(admitted)
        if not self.running:
            return None

        if self.pool.pages_in_use > self.high_watermark_pages:  # expect: FC101
            self._preempt_last()
        logger.debug("KV pages in use: %s", self.pool.pages_in_use)  # ok: FC101

        meta = self._decode_metadata()
        if self._use_long_path(meta):
            self.backend.init_forward_metadata(meta)
            logits = self.model.forward_decode_long(meta)
        elif meta.batch_size <= self.runner.max_captured:
            logits = self.runner.replay(meta)
        else:
            self.backend.init_forward_metadata(meta)
            logits = self.model.forward_decode(meta)
        return self._sample(logits)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            next_ids = self.step()
            if next_ids is None:
                continue
            tokens = next_ids.tolist()
            finished = []
            for req, tok in zip(self.running, tokens):
                req.output_ids.append(tok)
                if len(req.output_ids) >= req.max_new_tokens:
                    finished.append(req)
            for req in finished:
                self.running.remove(req)
                self.pool.drop_dev(torch.from_numpy(req.pages).to(self.device, non_blocking=True))
                self.pool.release(req.pages)
