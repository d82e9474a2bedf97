"""The serving loop: draft with suffix tries, verify in one forward, accept greedily."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np
import torch

from sfxserve.attention.batch import PrefillBatch, VerifyBatch
from sfxserve.attention.verify_backend import VerifyAttention
from sfxserve.config import SpecConfig
from sfxserve.drafter.drafter import DraftProposal, SuffixDrafter
from sfxserve.model import SpecModel
from sfxserve.runtime.graphs import VerifyGraphPool

logger = logging.getLogger(__name__)


@dataclass
class Request:
    req_id: int
    prompt_ids: List[int]
    max_new_tokens: int
    pages: List[int] = field(default_factory=list)
    seq_len: int = 0
    last_token: int = 0
    output_ids: List[int] = field(default_factory=list)


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self._free: Deque[int] = deque(range(num_pages))

    def grow(self, req: Request, new_len: int) -> None:
        need = (new_len + self.page_size - 1) // self.page_size
        while len(req.pages) < need:
            req.pages.append(self._free.popleft())

    def release(self, req: Request) -> None:
        self._free.extend(req.pages)
        req.pages.clear()


class SuffixSpecEngine:
    def __init__(self, cfg: SpecConfig, local_rank: int = 0):
        self.cfg = cfg
        self.device = torch.device("cuda", local_rank)
        self.attn = VerifyAttention(cfg, self.device)
        self.model = SpecModel(cfg, self.attn).to(self.device)
        self.graphs = VerifyGraphPool(cfg, self.model, self.attn, self.device)
        self.drafter = SuffixDrafter(cfg, self.device, cfg.max_spec_factor, cfg.min_token_prob)
        self.pages = PageAllocator(cfg.max_pages, cfg.page_size)
        self.running: Dict[int, Request] = {}
        self.accept_buf: Optional[torch.Tensor] = None

    # -- admission ---------------------------------------------------------------------

    def _validate_prompt(self, prompt_ids: List[int], max_new_tokens: int) -> None:
        assert len(prompt_ids) + max_new_tokens + self.cfg.max_draft_len <= self.cfg.max_context_len  # expect: FC109

    def add_request(self, req_id: int, prompt_ids: List[int], max_new_tokens: int) -> None:
        self._validate_prompt(prompt_ids, max_new_tokens)
        req = Request(req_id, list(prompt_ids), max_new_tokens)
        self.pages.grow(req, len(prompt_ids))
        req.seq_len = len(prompt_ids)
        self.drafter.start_request(req_id, prompt_ids)
        self._prefill([req])
        self.running[req_id] = req

    def _prefill(self, reqs: List[Request]) -> None:
        ids = np.concatenate([np.asarray(r.prompt_ids, dtype=np.int64) for r in reqs])
        pos = np.concatenate([np.arange(len(r.prompt_ids), dtype=np.int64) for r in reqs])
        kv_indptr = np.cumsum([0] + [len(r.pages) for r in reqs]).astype(np.int32)
        last = np.array([(r.seq_len - 1) % self.cfg.page_size + 1 for r in reqs], dtype=np.int32)
        indices = np.concatenate([np.asarray(r.pages, dtype=np.int32) for r in reqs])
        batch = PrefillBatch(
            req_ids=[r.req_id for r in reqs],
            input_ids=torch.from_numpy(ids).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            prompt_lens=[len(r.prompt_ids) for r in reqs],
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_indices=torch.from_numpy(indices).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=torch.from_numpy(last),
        )
        self.attn.plan_prefill(batch)
        logits = self.model.prefill_forward(batch.input_ids, batch.positions)
        ends = np.cumsum(batch.prompt_lens) - 1
        first = torch.argmax(logits[torch.from_numpy(ends).to(self.device)], dim=-1)
        for r, tok in zip(reqs, first.cpu().tolist()):
            r.last_token = tok

    # -- per step ----------------------------------------------------------------------

    def _build_verify_batch(self, reqs: List[Request], proposal: DraftProposal) -> VerifyBatch:
        bs = len(reqs)
        step = self.cfg.max_draft_len + 1
        for r in reqs:
            self.pages.grow(r, r.seq_len + step)
        seq_lens = np.array([r.seq_len + step for r in reqs], dtype=np.int32)
        pages_per = np.array([len(r.pages) for r in reqs], dtype=np.int32)
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_per, out=kv_indptr[1:])
        last = (seq_lens - 1) % self.cfg.page_size + 1
        indices = np.concatenate([np.asarray(r.pages, dtype=np.int32) for r in reqs])
        last_tok = torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=self.device)
        input_ids = torch.cat([last_tok[:, None], proposal.draft_tokens.clamp_min(0)], dim=1).reshape(-1)
        pos = np.concatenate([np.arange(r.seq_len, r.seq_len + step, dtype=np.int64) for r in reqs])
        return VerifyBatch(
            batch_size=bs,
            num_tokens=bs * step,
            input_ids=input_ids,
            positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            seq_lens=torch.tensor(seq_lens, device=self.device),
            kv_indices=torch.from_numpy(indices).to(self.device, non_blocking=True),
            kv_last_page_len=torch.tensor(last, dtype=torch.int32, device=self.device),
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32) * step,
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_last_page_len_cpu=torch.from_numpy(last.astype(np.int32)),
            max_seq_len=int(seq_lens.max()),
        )

    def step(self) -> List[Tuple[int, List[int]]]:
        reqs = list(self.running.values())
        if not reqs:
            return []
        bs = len(reqs)
        req_ids = [r.req_id for r in reqs]
        proposal = self.drafter.propose(req_ids)
        batch = self._build_verify_batch(reqs, proposal)
        if self.graphs.has_bucket(bs):
            logits = self.graphs.replay(batch)
        else:
            self.attn.plan_eager_verify(batch)
            logits = self.model.verify_forward(batch.input_ids, batch.positions, -1)
        step = self.cfg.max_draft_len + 1
        target = torch.argmax(logits, dim=-1).view(bs, step)
        if self.accept_buf is None:
            self.accept_buf = torch.zeros(self.cfg.max_batch_size, dtype=torch.int32, device=self.device)  # ok: FC107
        match = (target[:, :-1] == proposal.draft_tokens).int()
        num_accepted = torch.cumprod(match, dim=1).sum(dim=1)
        self.accept_buf[:bs].copy_(num_accepted)
        logger.debug("accepted per row: %s", num_accepted)  # ok: FC101
        accept_lens = num_accepted.tolist()  # expect: FC101
        # the next verify step's query layout, written where the planner would find it
        torch.cumsum(num_accepted + 1, 0, out=self.attn.qo_indptr[1 : bs + 1])  # expect: FC104
        accepted_rows = self.drafter.observe(req_ids, target, accept_lens)
        done: List[Tuple[int, List[int]]] = []
        for r, new in zip(reqs, accepted_rows):
            r.output_ids.extend(new)
            r.seq_len += len(new)
            r.last_token = new[-1]
            if len(r.output_ids) >= r.max_new_tokens:
                done.append((r.req_id, r.output_ids))
        for rid, _ in done:
            self.pages.release(self.running.pop(rid))
            self.drafter.finish_request(rid)
        return done

    def _build_decode_batch(self, reqs: List[Request]) -> VerifyBatch:
        bs = len(reqs)
        for r in reqs:
            self.pages.grow(r, r.seq_len + 1)
        seq_lens = np.array([r.seq_len + 1 for r in reqs], dtype=np.int32)
        kv_indptr = np.cumsum([0] + [len(r.pages) for r in reqs]).astype(np.int32)
        last = ((seq_lens - 1) % self.cfg.page_size + 1).astype(np.int32)
        indices = np.concatenate([np.asarray(r.pages, dtype=np.int32) for r in reqs])
        return VerifyBatch(
            batch_size=bs,
            num_tokens=bs,
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=self.device),
            positions=torch.tensor([r.seq_len for r in reqs], dtype=torch.int64, device=self.device),
            seq_lens=torch.tensor(seq_lens, device=self.device),
            kv_indices=torch.from_numpy(indices).to(self.device, non_blocking=True),
            kv_last_page_len=torch.tensor(last, device=self.device),
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_last_page_len_cpu=torch.from_numpy(last),
            max_seq_len=int(seq_lens.max()),
        )

    def decode_only(self, block_tables: torch.Tensor) -> torch.Tensor:
        """No request has a draft: a plain decode step (used when the tries go cold)."""
        batch = self._build_decode_batch(list(self.running.values()))
        self.attn.plan_plain_decode(batch)
        out = self.model.decode_forward(batch.input_ids, batch.positions, block_tables)
        self.attn.end_plain_decode()
        return out
