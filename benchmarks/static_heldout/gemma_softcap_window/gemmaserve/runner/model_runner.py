"""Requests, pages, the per-step loop and sampling with the final logit soft-cap."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from gemmaserve.attn.backend import GemmaFlashInferBackend
from gemmaserve.common import GemmaConfig, StepBatch
from gemmaserve.model import GemmaForCausalLM
from gemmaserve.runner.graph_runner import DecodeGraphRunner

@dataclass
class Request:
    req_id: int
    prompt_ids: List[int]
    max_new_tokens: int
    slot: int = -1
    output_ids: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class GemmaModelRunner:
    def __init__(self, cfg: GemmaConfig, num_pages: int, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.num_pages = num_pages
        self.backend = GemmaFlashInferBackend(cfg, self.device)
        self.model = GemmaForCausalLM(cfg, self.backend).to(self.device)
        self.kv_caches = self.model.allocate_kv_caches(num_pages, self.device)
        self.graph_runner = DecodeGraphRunner(self.model, self.backend, cfg, self.device)
        self.page_table_np = np.zeros((cfg.max_batch_size, cfg.max_pages_per_seq), dtype=np.int32)
        # page 0 is the padding page that idle graph rows point at
        self.free_pages: List[int] = list(range(num_pages - 1, 0, -1))
        self.free_slots: List[int] = list(range(cfg.max_batch_size - 1, -1, -1))
        self.waiting: List[Request] = []
        self.running: Dict[int, Request] = {}
        self.vocab_mask = torch.ones(cfg.vocab_size, dtype=torch.bool, device=self.device)
        self.out_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.done_event = torch.cuda.Event()
        self._capped: Optional[torch.Tensor] = None
        self._last_reqs: List[Request] = []

    def warmup_graphs(self) -> None:
        self.graph_runner.record_all(self.kv_caches)

    # ------------------------------------------------------------------ requests and pages
    def add_request(self, req_id: int, prompt_ids: List[int], max_new_tokens: int) -> None:
        assert len(prompt_ids) + max_new_tokens <= self.cfg.max_context_len  # expect: FC109
        self.waiting.append(Request(req_id, list(prompt_ids), max_new_tokens))

    def _take_page(self, req: Request) -> None:
        if not self.free_pages:
            raise RuntimeError("out of KV pages; lower max_batch_size or raise num_pages")
        page = self.free_pages.pop()
        self.page_table_np[req.slot, len(req.pages)] = page
        req.pages.append(page)

    def _admit(self, req: Request) -> None:
        req.slot = self.free_slots.pop()
        for _ in range(-(-len(req.prompt_ids) // self.cfg.page_size)):
            self._take_page(req)
        self.running[req.req_id] = req

    def _release(self, req: Request) -> None:
        self.free_pages.extend(req.pages)
        self.free_slots.append(req.slot)
        self.page_table_np[req.slot] = 0
        del self.running[req.req_id]
        assert len(self.free_pages) < self.num_pages, "a KV page was freed twice"  # ok: FC109

    # ------------------------------------------------------------------ batches
    def _batch(self, reqs: List[Request], lens: np.ndarray, pos: np.ndarray, ids: List[int], extend: bool):
        ps = self.cfg.page_size
        slots = np.array([r.slot for r in reqs], dtype=np.int64)
        owner = np.repeat(slots, lens) if extend else slots
        loc = self.page_table_np[owner, pos // ps].astype(np.int64) * ps + pos % ps
        seq_lens = torch.from_numpy(lens)
        return StepBatch(
            batch_size=len(reqs),
            input_ids=torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            out_cache_loc=torch.from_numpy(loc).to(self.device, non_blocking=True),
            seq_lens=seq_lens.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens,
            page_table_np=self.page_table_np[slots],
            extend_lens=seq_lens.to(self.device, non_blocking=True) if extend else None,
        )

    def _decode_batch(self, reqs: List[Request]) -> StepBatch:
        for r in reqs:
            if (r.seq_len - 1) // self.cfg.page_size >= len(r.pages):
                self._take_page(r)
        lens = np.array([r.seq_len for r in reqs], dtype=np.int32)
        return self._batch(reqs, lens, (lens - 1).astype(np.int64), [r.output_ids[-1] for r in reqs], False)

    def _prefill_batch(self, reqs: List[Request]) -> StepBatch:
        lens = np.array([len(r.prompt_ids) for r in reqs], dtype=np.int32)
        pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        return self._batch(reqs, lens, pos, [t for r in reqs for t in r.prompt_ids], True)

    # ------------------------------------------------------------------ the step
    def step(self) -> int:
        if self.waiting:
            return self._prefill_step()
        if not self.running:
            return 0
        reqs = list(self.running.values())
        batch = self._decode_batch(reqs)
        bs = batch.batch_size
        bucket = self.cfg.bucket_for(bs)
        runner = self.graph_runner
        if bucket is None or bucket not in runner.graphs:
            self.backend.init_forward_metadata(batch)
            logits = self.model(batch.input_ids, batch.positions, batch.out_cache_loc, self.kv_caches)
        elif self._same_requests(reqs) and not self._starts_page(reqs):
            # same requests as last step and nobody opens a new page: every sequence grew by one token,
            # so bump the bound last-page lengths and replay the bucket without re-planning
            runner.input_ids[:bs].copy_(batch.input_ids, non_blocking=True)
            runner.static_positions[:bs].copy_(batch.positions, non_blocking=True)
            runner.out_cache_loc[:bs].copy_(batch.out_cache_loc, non_blocking=True)
            runner.buffers.kv_last_page_len[:bs].add_(1)  # expect: FC104
            runner.graphs[bucket].replay()
            logits = runner.static_logits[:bs]
        else:
            logits = runner.replay(batch)
        next_ids = self._sample(logits, bs)
        self.out_cpu[:bs].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.done_event.record()
        self._last_reqs = reqs
        return bs

    def _prefill_step(self) -> int:
        budget = self.cfg.max_prefill_tokens
        reqs: List[Request] = []
        while self.waiting and len(reqs) < len(self.free_slots) and len(self.waiting[0].prompt_ids) <= budget:
            req = self.waiting.pop(0)
            budget -= len(req.prompt_ids)
            self._admit(req)
            reqs.append(req)
        batch = self._prefill_batch(reqs)
        self.backend.init_forward_metadata(batch)
        last_idx = torch.from_numpy(np.cumsum(batch.seq_lens_cpu.numpy()) - 1).to(self.device)
        logits = self.model.prefill(batch.input_ids, batch.positions, batch.out_cache_loc, self.kv_caches, last_idx)
        next_ids = self._sample(logits, batch.batch_size)
        self.out_cpu[: batch.batch_size].copy_(next_ids, non_blocking=True)
        self.done_event.record()
        self._last_reqs = reqs
        return batch.batch_size

    def _same_requests(self, reqs: List[Request]) -> bool:
        return [r.req_id for r in reqs] == [r.req_id for r in self._last_reqs]

    def _starts_page(self, reqs: List[Request]) -> bool:
        return any((r.seq_len - 1) % self.cfg.page_size == 0 for r in reqs)

    def _sample(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        cap = self.cfg.final_logit_softcap
        if cap is not None:
            if self._capped is None:
                self._capped = torch.empty(  # ok: FC107
                    self.cfg.max_batch_size, self.cfg.vocab_size, dtype=torch.float32, device=self.device
                )
            capped = self._capped[:bs]
            torch.div(logits, cap, out=capped)
            capped.tanh_().mul_(cap)
            logits = capped
        logits = torch.where(self.vocab_mask, logits, float("-inf"))  # ok: FC101
        if torch.isnan(logits).any():  # expect: FC101
            raise RuntimeError("NaN logits after the final soft-cap")
        return torch.argmax(logits, dim=-1)

    # ------------------------------------------------------------------ outputs (server loop, after step)
    def collect(self) -> Dict[int, int]:
        self.done_event.synchronize()
        ids = self.out_cpu[: len(self._last_reqs)].tolist()
        out: Dict[int, int] = {}
        for req, tok in zip(self._last_reqs, ids):
            req.output_ids.append(tok)
            out[req.req_id] = tok
            if len(req.output_ids) >= req.max_new_tokens or req.seq_len >= self.cfg.max_context_len:
                self._release(req)
        return out
