from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from diffserve.attention.backend import DiffAttnBackend
from diffserve.attention.metadata import DiffForwardBatch
from diffserve.config import DiffConfig
from diffserve.kv.pair_pool import PairedKVPool
from diffserve.model.diff_model import DiffLM
from diffserve.runner.graph_runner import DiffGraphRunner


@dataclass
class StepInput:
    rids: List[int]
    token_ids: List[int]  # flat, request after request
    num_new_tokens: List[int]
    is_decode: bool
    max_top_logprobs: int = 0


class DiffModelRunner:
    def __init__(self, cfg: DiffConfig, num_pages: int, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        dev = self.device
        self.pool = PairedKVPool(cfg, num_pages, cfg.page_size, dev)
        self.backend = DiffAttnBackend(cfg, self.pool, dev)
        self.model = DiffLM(cfg, self.backend, dev)
        self.graph_runner = DiffGraphRunner(cfg, self.model, self.backend, dev)

        max_bs, max_tok = cfg.max_batch_size, cfg.max_num_batched_tokens
        max_nnz = max_bs * cfg.max_pages_per_req
        self.input_ids_gpu = torch.zeros(max_tok, dtype=torch.int64, device=dev)
        self.positions_gpu = torch.zeros(max_tok, dtype=torch.int64, device=dev)
        self.out_loc_gpu = torch.zeros(max_tok, dtype=torch.int64, device=dev)
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.qo_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_gpu = torch.zeros(max_nnz, dtype=torch.int32, device=dev)
        self.done_gpu = torch.zeros(max_bs, dtype=torch.bool, device=dev)

        self.tokens_cpu = torch.zeros(3, max_tok, dtype=torch.int64, pin_memory=True)  # ids, positions, slots
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_nnz, dtype=torch.int32, pin_memory=True)
        self.next_ids_cpu = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.out_event = torch.cuda.Event()

        self.top_logprob_buf = torch.zeros(max_bs, 1, dtype=torch.float32, device=dev)
        self._eos_ids: Optional[torch.Tensor] = None
        self.graph_runner.capture_all_buckets()

    # ------------------------------------------------------------------ host-side batch
    def _token_slots(self, step: StepInput) -> Tuple[np.ndarray, np.ndarray]:
        ps = self.cfg.page_size
        positions, slots = [], []
        for rid, n_new in zip(step.rids, step.num_new_tokens):
            end = self.pool.req_lens[rid]
            pages = self.pool.req_pages[rid]
            for pos in range(end - n_new, end):
                positions.append(pos)
                slots.append(pages[pos // ps] * ps + pos % ps)
        return np.asarray(positions, dtype=np.int64), np.asarray(slots, dtype=np.int64)

    def _build_batch(self, step: StepInput) -> DiffForwardBatch:
        rids = step.rids
        bs = len(rids)
        for rid, n_new in zip(rids, step.num_new_tokens):
            self.pool.reserve(rid, self.pool.req_lens.get(rid, 0) + n_new)
        indptr, indices, last = self.pool.page_table(rids)
        lens = np.asarray([self.pool.req_lens[r] for r in rids], dtype=np.int32)
        qo = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(step.num_new_tokens, out=qo[1:])
        n_tok, nnz = int(qo[-1]), len(indices)
        positions, slots = self._token_slots(step)

        self.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(indptr))
        self.kv_last_page_cpu[:bs].copy_(torch.from_numpy(last))
        self.kv_indices_cpu[:nnz].copy_(torch.from_numpy(indices))
        self.seq_lens_cpu[:bs].copy_(torch.from_numpy(lens))
        self.qo_indptr_cpu[: bs + 1].copy_(torch.from_numpy(qo))
        staged = self.tokens_cpu[:, :n_tok]
        staged[0].copy_(torch.as_tensor(step.token_ids, dtype=torch.int64))
        staged[1].copy_(torch.from_numpy(positions))
        staged[2].copy_(torch.from_numpy(slots))

        self.input_ids_gpu[:n_tok].copy_(staged[0], non_blocking=True)
        self.positions_gpu[:n_tok].copy_(staged[1], non_blocking=True)
        self.out_loc_gpu[:n_tok].copy_(staged[2], non_blocking=True)
        self.kv_indices_gpu[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        self.seq_lens_gpu[:bs].copy_(self.seq_lens_cpu[:bs], non_blocking=True)
        self.qo_indptr_gpu[: bs + 1].copy_(self.qo_indptr_cpu[: bs + 1], non_blocking=True)
        return DiffForwardBatch(
            batch_size=bs,
            rids=list(rids),
            is_decode=step.is_decode,
            input_ids=self.input_ids_gpu[:n_tok],
            positions=self.positions_gpu[:n_tok],
            seq_lens=self.seq_lens_gpu[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            kv_indptr_cpu=self.kv_indptr_cpu[: bs + 1],
            kv_indices=self.kv_indices_gpu[:nnz],
            kv_last_page_cpu=self.kv_last_page_cpu[:bs],
            out_cache_loc=self.out_loc_gpu[:n_tok],
            qo_indptr=self.qo_indptr_gpu[: bs + 1],
            qo_indptr_cpu=self.qo_indptr_cpu[: bs + 1],
            prefix_cached=any(self.pool.req_lens[r] > n for r, n in zip(rids, step.num_new_tokens)),
        )

    def _maybe_compact(self) -> None:
        free_frac = len(self.pool.free) / self.pool.num_pages
        if free_frac > 0.25 or not self.pool.req_pages:
            return
        moved = self.pool.compact()
        if moved:
            self._apply_compaction(moved)

    def _apply_compaction(self, moved: Dict[int, int]) -> None:
        """Rename the page ids already sitting in the captured buckets' index buffer."""
        lut = torch.arange(self.pool.num_pages, dtype=torch.int32, device=self.device)
        src = torch.tensor(list(moved.keys()), dtype=torch.int64, device=self.device)
        lut[src] = torch.tensor(list(moved.values()), dtype=torch.int32, device=self.device)
        idx = self.backend.kv_indices_buf
        idx.copy_(lut[idx.long()])  # expect: FC104
        self.pool.moved = {}

    # ------------------------------------------------------------------ the step
    def forward_step(self, step: StepInput) -> torch.cuda.Event:
        self._maybe_compact()
        fb = self._build_batch(step)
        n = fb.batch_size
        if fb.is_decode and n <= self.cfg.max_graph_bs:
            bs = next(b for b in sorted(self.cfg.graph_buckets) if b >= n)
            logits = self.graph_runner.replay(fb, bs)
        elif fb.is_decode:
            self.backend.plan_eager_decode(fb)
            logits = self.model.forward_decode(fb.input_ids, fb)
        else:
            self.backend.plan_prefill(fb)
            logits = self.model.forward_extend(fb.input_ids, fb)

        if self._eos_ids is None:
            self._eos_ids = torch.tensor(self.cfg.eos_token_ids, dtype=torch.int64, device=self.device)  # ok: FC107
        k = step.max_top_logprobs
        if k > self.top_logprob_buf.shape[1]:
            self.top_logprob_buf = torch.zeros(self.cfg.max_batch_size, k, dtype=torch.float32, device=self.device)  # expect: FC107
        if k:
            vals, _ = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
            self.top_logprob_buf[:n, :k].copy_(vals)

        sampled = torch.argmax(logits, dim=-1)
        self.done_gpu[:n] = torch.isin(sampled, self._eos_ids)
        at_limit = self.seq_lens_gpu[:n] >= self.cfg.max_context_len
        if at_limit.any():  # expect: FC101
            self.done_gpu[:n] |= at_limit
        next_ids = torch.where(self.done_gpu[:n], self.cfg.eos_token_ids[0], sampled)  # ok: FC101
        self.next_ids_cpu[:n].copy_(next_ids, non_blocking=True)
        self.out_event.record()
        return self.out_event

    def release(self, rids: Sequence[int]) -> None:
        for rid in rids:
            self.pool.release(rid)


class OutputDrain(threading.Thread):
    """Hands sampled ids back to the detokenizer once the step's copy has landed."""

    def __init__(self, runner: DiffModelRunner, sink: Callable[[List[int]], None]):
        super().__init__(daemon=True)
        self.runner = runner
        self.sink = sink
        self.pending: List[Tuple[torch.cuda.Event, int]] = []
        self.lock = threading.Lock()

    def push(self, event: torch.cuda.Event, n: int) -> None:
        with self.lock:
            self.pending.append((event, n))

    def run(self) -> None:
        while True:
            with self.lock:
                item = self.pending.pop(0) if self.pending else None
            if item is None:
                continue
            event, n = item
            event.synchronize()
            self.sink(self.runner.next_ids_cpu[:n].tolist())
