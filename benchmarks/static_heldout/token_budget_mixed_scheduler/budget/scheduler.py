"""Each step spends a token budget: every running decode first, then prefill chunks."""

from collections import deque
from typing import Deque, List, Tuple

import numpy as np

from .attn.kv_pool import PagedKVPool
from .config import BudgetConfig
from .outputs import PendingOutputs
from .request import Request, SchedulerOutput

DECODE, PREFILL = 0, 1


class BudgetScheduler:
    def __init__(self, cfg: BudgetConfig, pool: PagedKVPool) -> None:
        self.cfg = cfg
        self.pool = pool
        self.pending = PendingOutputs(cfg.max_num_seqs)
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []

    def add_request(self, req: Request) -> None:
        assert req.prompt_ids, "empty prompt"  # expect: FC109
        self.waiting.append(req)

    def _drain_outputs(self) -> None:
        p = self.pending
        if not p.in_flight:
            return
        p.done.synchronize()  # expect: FC101
        for req, tok in zip(p.rows, p.tokens_host[: len(p.rows)].tolist()):
            req.output_ids.append(tok)
        p.in_flight = False

    def schedule(self) -> SchedulerOutput:
        self._drain_outputs()
        cfg = self.cfg
        for r in self.running:
            if r.finished:
                self.pool.free(r.pages)
        self.running = [r for r in self.running if not r.finished]
        budget = cfg.token_budget
        decodes = [r for r in self.running if not r.in_prefill][: min(budget, cfg.max_num_seqs)]
        budget -= len(decodes)
        pieces: List[Tuple[Request, int, int]] = []
        candidates = [r for r in self.running if r.in_prefill]
        while self.waiting and len(self.running) + len(pieces) < cfg.max_num_seqs:
            r = self.waiting.popleft()
            self.running.append(r)
            candidates.append(r)
        for r in candidates:
            if budget <= 0 or len(decodes) + len(pieces) >= cfg.max_num_seqs:
                break
            take = min(cfg.chunk_size, len(r.prompt_ids) - r.num_computed, budget)
            pieces.append((r, r.num_computed, take))
            budget -= take
        used = cfg.token_budget - budget
        assert used <= cfg.token_budget, "token budget overspent"  # ok: FC109
        return self._assemble(decodes, pieces, used)

    def _assemble(self, decodes: List[Request], pieces: List[Tuple[Request, int, int]], n_tokens: int) -> SchedulerOutput:
        page = self.cfg.page_size
        ids, pos, kind, q_lens, kv_lens = [], [], [], [], []
        for r in decodes:
            ids.append(r.output_ids[-1] if r.output_ids else r.prompt_ids[-1])
            pos.append(r.seq_len)
            kind.append(DECODE)
            q_lens.append(1)
            kv_lens.append(r.seq_len + 1)
        for r, start, take in pieces:
            ids.extend(r.prompt_ids[start : start + take])
            pos.extend(range(start, start + take))
            kind.extend([PREFILL] * take)
            q_lens.append(take)
            kv_lens.append(start + take)
        rows = [*decodes, *(r for r, _, _ in pieces)]
        for r, n in zip(rows, kv_lens):
            need = -(-n // page) - len(r.pages)
            if need > 0:
                r.pages.extend(self.pool.alloc(need))
        kv_lens_np = np.asarray(kv_lens, dtype=np.int32)
        n_pages = (kv_lens_np + page - 1) // page
        qo_indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(np.asarray(q_lens, dtype=np.int32), out=qo_indptr[1:])
        kv_indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(n_pages, out=kv_indptr[1:])
        block_tables = np.zeros((len(rows), int(n_pages.max(initial=1))), dtype=np.int32)
        for i, (r, n) in enumerate(zip(rows, n_pages.tolist())):
            block_tables[i, :n] = r.pages[:n]
        # sample the decodes and the pieces that finish their prompt
        sampled = list(decodes) + [r for r, s, t in pieces if s + t == len(r.prompt_ids)]
        logits_rows = [i for i in range(len(decodes))]
        logits_rows += [len(decodes) + j for j, (r, s, t) in enumerate(pieces) if s + t == len(r.prompt_ids)]
        for r, s, t in pieces:
            r.num_computed = s + t
        return SchedulerOutput(
            decode_reqs=decodes,
            prefill_pieces=pieces,
            num_tokens=n_tokens,
            input_ids_np=np.asarray(ids, dtype=np.int64),
            positions_np=np.asarray(pos, dtype=np.int64),
            token_kind_np=np.asarray(kind, dtype=np.int8),
            logits_rows_np=qo_indptr[1:][np.asarray(logits_rows, dtype=np.int64)] - 1,
            qo_indptr_np=qo_indptr,
            kv_indptr_np=kv_indptr,
            kv_indices_np=np.concatenate([np.asarray(r.pages[:n], dtype=np.int32) for r, n in zip(rows, n_pages)]),
            last_page_len_np=(kv_lens_np - (n_pages - 1) * page).astype(np.int32),
            block_tables_np=block_tables,
            seq_lens_np=kv_lens_np,
            sampled_rows=sampled,
        )
