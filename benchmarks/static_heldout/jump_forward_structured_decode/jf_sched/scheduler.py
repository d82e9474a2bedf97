"""Jump-forward scheduler: forced grammar runs become extend segments of the next step."""

from __future__ import annotations

import collections
import dataclasses
from typing import Deque, Dict, List, Optional

import numpy as np
import torch

from jf.batch import MixedBatch, Seq
from jf.config import JFConfig
from jf.grammar import GrammarMatcherPool, TokenFSM, apply_token_bitmask
from jf.kv import PagedKVPool
from jf_attn.backend import MixedAttnBackend
from jf_attn.graphs import DecodeGraphPool
from jf_attn.model import JFModel

from .detok import Retokenizer


@dataclasses.dataclass
class StepHandle:
    rids: List[int]
    next_ids: torch.Tensor
    mixed: bool


class JumpForwardScheduler:
    def __init__(self, cfg: JFConfig, retok: Retokenizer, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.pool = PagedKVPool(cfg, self.device)
        self.backend = MixedAttnBackend(cfg, self.pool, self.device)
        self.model = JFModel(cfg, self.backend).to(self.device)
        self.matchers = GrammarMatcherPool(cfg.max_batch_size, cfg.vocab_size, cfg.max_jump_tokens, self.device)
        self.graphs = DecodeGraphPool(cfg, self.model, self.backend, self.matchers, self.device)
        for bs in self.graphs.sizes:
            self.graphs.record_bucket(bs)
        self.retok = retok
        self.waiting: Deque[Seq] = collections.deque()
        self.running: List[Seq] = []
        self.free_slots = list(range(cfg.max_batch_size - 1, -1, -1))
        self.jumped_tokens = 0
        self._next_rid = 0

    def add_request(self, prompt: List[int], fsm: Optional[TokenFSM], max_new_tokens: int = 256) -> int:
        assert fsm is None or fsm.vocab_size <= self.cfg.vocab_size, "grammar vocabulary exceeds the model's"  # expect: FC109
        rid = self._next_rid
        self._next_rid += 1
        seq = Seq(rid=rid, slot=-1, tokens=list(prompt), max_new_tokens=max_new_tokens, prompt_len=len(prompt))
        if fsm is not None:
            self.matchers.attach(rid, fsm)
        self.waiting.append(seq)
        return rid

    def _admit(self) -> List[Seq]:
        new = []
        budget = self.cfg.max_num_tokens - sum(s.pending for s in self.running)
        while self.waiting and self.free_slots and len(self.running) + len(new) < self.cfg.max_batch_size:
            seq = self.waiting[0]
            if seq.pending > budget or not self.pool.ensure(self.free_slots[-1], len(seq.tokens) + 1):
                break
            self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            budget -= seq.pending
            new.append(seq)
        return new

    def _check_accounting(self) -> None:
        assert self.jumped_tokens >= 0 and len(self.running) <= self.cfg.max_batch_size  # ok: FC109

    def _apply_runs(self, runs: Dict[int, List[int]]) -> None:
        by_rid = {s.rid: s for s in self.running}
        for rid, run in runs.items():
            seq = by_rid[rid]
            merged, drop = self.retok.merge(seq.tokens, run)
            if drop:
                # the boundary token was retokenized together with the forced text
                seq.num_computed -= drop
                self.pool.truncate(seq.slot, seq.num_computed)
                row = self.running.index(seq)
                self.backend.graph_last_page_len[row] -= drop  # expect: FC104
            seq.tokens = merged
            self.pool.ensure(seq.slot, len(seq.tokens))
            self.jumped_tokens += len(run)

    def schedule_step(self, prev: Optional[StepHandle], prev_ids_np: Optional[np.ndarray]) -> Optional[StepHandle]:
        if prev is not None and prev_ids_np is not None:
            runs = self.matchers.advance(prev.rids, prev_ids_np)
            if runs:
                self._apply_runs(runs)
        self._check_accounting()
        self.running.extend(self._admit())
        if not self.running:
            return None
        for seq in self.running:
            self.pool.ensure(seq.slot, len(seq.tokens))
        # extend rows first: new prompts and rows with a jump-forward run pending
        ext = [s for s in self.running if s.pending > 1 or s.num_computed == 0]
        dec = [s for s in self.running if not (s.pending > 1 or s.num_computed == 0)]
        order = ext + dec
        batch = MixedBatch.build(order, len(ext), self.pool, self.device)
        rids = [s.rid for s in order]
        self.matchers.fill_bitmask(rids)
        n_tokens = int(batch.qo_indptr_np[-1])  # ok: FC101
        if batch.is_pure_decode and self.graphs.bucket(batch.batch_size) is not None:
            next_ids = self.graphs.replay_decode(batch)
            mixed = False
        else:
            self.backend.prepare_step(batch)
            if batch.is_pure_decode:
                logits = self.model.forward_decode(batch)
            else:
                logits = self.model.forward_mixed(batch)
            logits = apply_token_bitmask(logits, self.matchers.token_bitmask[: len(order)])
            next_ids = torch.argmax(logits, dim=-1)
            mixed = True
        for s in order:
            s.num_computed = len(s.tokens)
        self.running = order
        self.backend.tokens_planned += n_tokens
        return StepHandle(rids, next_ids, mixed)

    def finish_step(self, handle: StepHandle, ids_np: np.ndarray) -> None:
        """Called by the serving loop once the sampled ids are on the host."""
        by_rid = {s.rid: s for s in self.running}
        for rid, tok in zip(handle.rids, ids_np.tolist()):
            seq = by_rid[rid]
            seq.tokens.append(tok)
            if len(seq.tokens) - seq.prompt_len >= seq.max_new_tokens:
                seq.finished = True
        keep = []
        for s in self.running:
            if s.finished:
                self.pool.release(s.slot)
                self.matchers.detach(s.rid)
                self.free_slots.append(s.slot)
            else:
                keep.append(s)
        self.running = keep
