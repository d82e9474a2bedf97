"""Speculative engine: draft k tokens, verify them, roll the rejected ones back."""

from __future__ import annotations

import logging
from typing import List

import numpy as np
import torch

from spec_attn.backend import SpecAttnBackend
from spec_run.graphs import SpecGraphRunner
from spec_run.model import SpecLM
from spec_run.rollback import KVRollback
from spec_run.sampling import verify_and_sample
from specroll import PagedKVState, PagePool, RowState, SpecConfig, VerifyBatch

logger = logging.getLogger(__name__)


class SpecEngine:
    def __init__(self, cfg: SpecConfig, device_index: int = 0):
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        self.pool = PagePool(cfg.num_pages)
        self.state = PagedKVState(cfg, self.pool)
        self.backend = SpecAttnBackend(cfg, self.device)

        def kv(dims):
            return torch.zeros(dims.num_layers, cfg.num_pages, 2, cfg.page_size, dims.num_kv_heads,
                               dims.head_dim, dtype=torch.bfloat16, device=self.device)

        self.draft_kv = kv(cfg.draft)
        self.target_kv = kv(cfg.target)
        be = self.backend
        self.draft_model = SpecLM(cfg.draft, cfg.vocab_size, be.draft_attention,
                                  extend_attend=be.draft_extend_attention).to(self.device)
        self.target_model = SpecLM(cfg.target, cfg.vocab_size, be.target_attention).to(self.device)
        self.verifier = SpecLM(cfg.target, cfg.vocab_size, be.verify_attention, shared=self.target_model)
        self.runner = SpecGraphRunner(cfg, be, self.draft_model, self.target_model, self.verifier,
                                      self.draft_kv, self.target_kv, self.device)
        self.rollback = KVRollback(cfg, self.state, self.pool, be, self.device)
        self.speculate = True

    def start(self) -> None:
        self.runner.record_graphs()

    def admit(self, request_id: int, prompt: np.ndarray) -> int:
        """Add a request and run its prompt through the draft model."""
        pages = self.pool.alloc(-(-len(prompt) // self.cfg.page_size))
        self.state.rows.append(RowState(request_id=request_id, pages=pages, seq_len=len(prompt)))
        row = len(self.state.rows) - 1
        indptr, indices, last = self.state.page_table([row])
        self.backend.plan_draft_extend(
            torch.tensor([0, len(prompt)], dtype=torch.int32),
            torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(last),
        )
        ids = torch.from_numpy(prompt).to(self.device)
        pos = torch.arange(len(prompt), device=self.device)
        self.draft_model.extend(ids, pos, self.draft_kv, 1)
        return row

    def _draft_budget(self, rows: List[int]) -> np.ndarray:
        room = self.cfg.max_context - self.state.seq_lens(rows) - 1
        return np.clip(room, 0, self.cfg.num_draft_tokens).astype(np.int32)

    def step(self, rows: List[int], last_tokens: torch.Tensor) -> torch.Tensor:
        bs = len(rows)
        bucket = self.runner.bucket_for(bs)
        if bucket is None:
            raise ValueError(f"batch of {bs} rows is above the largest bucket")
        if not self.speculate:
            return self._plain_step(rows, bucket, last_tokens)

        k = self.cfg.num_draft_tokens
        draft_lens_cpu = torch.from_numpy(self._draft_budget(rows))
        n_new = int(draft_lens_cpu.sum())
        start_np = self.state.seq_lens(rows)
        for i, row in enumerate(rows):
            self.state.reserve(row, int(draft_lens_cpu[i]) + 1)
        indptr, indices, last = self.state.page_table(rows)
        SpecAttnBackend.load_tables(self.backend.draft_bufs, indptr, indices, last, bucket)
        SpecAttnBackend.load_tables(self.backend.target_bufs, indptr, indices, last, bucket)

        # 1. draft: k replays of the draft graph, pages reserved up front
        self.backend.prepare_draft_graph(bucket, bs)
        start = torch.from_numpy(start_np).to(self.device, non_blocking=True).long()
        tok = last_tokens
        drafts = []
        for j in range(k):
            logits = self.runner.replay_draft(bucket, tok, start + j)
            tok = torch.argmax(logits, dim=-1)
            drafts.append(tok)
        draft_tokens = torch.stack(drafts, dim=1)

        # 2. verify: the target over [last, d_0 .. d_{k-1}] per row
        vb = VerifyBatch(
            draft_tokens=draft_tokens,
            draft_lens=draft_lens_cpu.to(self.device, non_blocking=True),
            draft_lens_cpu=draft_lens_cpu,
            kv_indptr_cpu=torch.from_numpy(indptr),
            kv_indices_cpu=torch.from_numpy(indices),
            last_len_cpu=torch.from_numpy(last),
            batch_size=bs,
        )
        self.backend.plan_verify(vb)
        ids = torch.cat([last_tokens[:, None], draft_tokens], dim=1).flatten()
        vpos = (start[:, None] - 1 + torch.arange(k + 1, device=self.device)[None, :]).flatten()
        logits = self.runner.replay_verify(bucket, ids, vpos)
        out = verify_and_sample(logits, draft_tokens, vb.draft_lens, k)

        # 3. roll back what the target rejected
        if torch.equal(out.accept_counts, vb.draft_lens):  # expect: FC101
            logger.debug("all %d drafts accepted", n_new)
        else:
            self.rollback.rollback(out, vb, rows)
        return out.next_tokens

    def _plain_step(self, rows: List[int], bucket: int, last_tokens: torch.Tensor) -> torch.Tensor:
        for row in rows:
            self.state.reserve(row, 1)
        indptr, indices, last = self.state.page_table(rows)
        SpecAttnBackend.load_tables(self.backend.target_bufs, indptr, indices, last, bucket)
        self.backend.prepare_target_graph(bucket)
        pos = torch.from_numpy(self.state.seq_lens(rows) - 1).to(self.device, non_blocking=True).long()
        logits = self.runner.replay_target(bucket, last_tokens, pos)
        return torch.argmax(logits, dim=-1)
