"""The lookahead loop: propose from the n-gram index, verify (or plain-decode), accept, extend."""

from __future__ import annotations

from typing import Dict, List

import flashcheck
import torch

from lookahead import LookaheadConfig, NgramIndex
from la_attn.batch import RowState, build_lookahead_batch
from la_attn.decode_backend import DecodeBackend
from la_attn.verify_backend import VerifyBackend
from la_attn.workspace import VerifyWorkspaces
from la_engine.acceptance import AcceptanceTracker
from la_engine.graphs import DecodeGraphRunner
from la_engine.model import LookaheadModel


class LookaheadRunner:
    def __init__(self, cfg: LookaheadConfig, device: str = "cuda"):
        self.cfg, self.device = cfg, torch.device(device)
        self.workspaces = VerifyWorkspaces(cfg, self.device)
        self.decode = DecodeBackend(cfg, self.workspaces, self.device)
        self.verify = VerifyBackend(cfg, self.workspaces, self.device)
        self.model = LookaheadModel(cfg, self.decode, self.verify, self.device).to(self.device)
        self.graphs = DecodeGraphRunner(self.model, self.decode, cfg, self.device)
        self.tracker = AcceptanceTracker(cfg, self.decode, self.device)
        self.indexes: Dict[int, NgramIndex] = {}
        self.rows: List[RowState] = []
        self.free_pages = list(range(1, cfg.num_pages))
        self.graphs.capture_all()

    def add_request(self, rid: int, prompt: List[int], pages: List[int]) -> None:
        index = NgramIndex(self.cfg.ngram_n)
        index.extend(prompt)
        self.indexes[rid] = index
        self.rows.append(RowState(rid, len(prompt) - 1, prompt[-1], pages))

    def _reserve_pages(self, branches: List[List[List[int]]]) -> None:
        ps = self.cfg.page_size
        for r, br in zip(self.rows, branches):
            need = -(-(r.cached_len + 1 + sum(map(len, br))) // ps) - len(r.pages)
            for _ in range(max(need, 0)):
                r.pages.append(self.free_pages.pop())

    @flashcheck.hot_path
    def step(self) -> Dict[int, List[int]]:
        rows, n = self.rows, len(self.rows)
        branches = [self.indexes[r.rid].propose(self.cfg.max_draft) for r in rows]
        self._reserve_pages(branches)
        batch = build_lookahead_batch(rows, branches, self.cfg, self.device)
        self.tracker.load(batch)
        bs = self.graphs.bucket_for(n)
        if batch.total_drafts == 0 and bs is not None:
            logits = self.graphs.replay(batch)
        elif batch.total_drafts == 0:
            self.decode.plan_eager(batch)
            logits = self.model.decode(batch.input_ids, batch.positions, batch.slot_mapping, None)
        else:
            self.verify.prepare_verify(batch, self.tracker.query_lens_dev[:n], batch.query_lens_cpu)
            logits = self.model.verify(batch.input_ids, batch.positions, batch.slot_mapping)
        targets = torch.argmax(logits, dim=-1)[batch.target_index]
        accepted = self.tracker.commit(batch.drafts, targets, n)
        packed = torch.cat([accepted[:, None].long(), targets], dim=1)
        result = packed.tolist()  # expect: FC101
        out: Dict[int, List[int]] = {}
        for r, row in zip(rows, result):
            k = row[0]
            new_tokens = row[1 : k + 2]  # the accepted drafts and the bonus token
            self.indexes[r.rid].extend(new_tokens)
            r.cached_len += 1 + k
            r.last_token = new_tokens[-1]
            out[r.rid] = new_tokens
        return out
