"""The sampling engine: stage per-request parameters, replay the decode+sample graph."""

import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from fs_attn.backend import DecodeBackend, DecodeInputs, PrefillInputs
from fs_run.graphs import DecodeGraphRunner
from fs_run.model import SampledLM
from fsample import GraphSampler, RequestSampling, SamplingEngineConfig, SamplingParamsStager


@dataclass
class DecodeSchedule:
    request_ids: List[int]
    requests: List[RequestSampling]
    seq_lens: np.ndarray  # per sample row
    page_tables: List[np.ndarray]
    window_page_tables: List[np.ndarray]
    input_ids: np.ndarray
    slots: np.ndarray
    record_seeds: bool = False
    no_page_crossing: bool = False


@dataclass
class OutputState:
    results: Dict[int, List[int]] = field(default_factory=dict)


class OutputThread(threading.Thread):
    """Reads the sampled tokens from pinned memory once the step's event has completed."""

    def __init__(self, q: "queue.Queue", tokens_pinned: torch.Tensor, state: OutputState):
        super().__init__(daemon=True)
        self.q = q
        self.tokens_pinned = tokens_pinned
        self.state = state

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            done, n, rids = item
            done.synchronize()
            toks = self.tokens_pinned[:n].tolist()  # ok: FC101
            for rid, tok in zip(rids, toks):
                self.state.results.setdefault(rid, []).append(tok)


class SamplingEngine:
    def __init__(self, cfg: SamplingEngineConfig):
        self.cfg = cfg
        self.device = cfg.device
        self.stager = SamplingParamsStager(cfg)
        self.sampler = GraphSampler(cfg.vocab_size, cfg.max_rows, cfg.device)
        self.backend = DecodeBackend(cfg)
        self.model = SampledLM(cfg, self.backend).to(self.device)
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
            dtype=torch.bfloat16, device=self.device,
        )
        self.runner = DecodeGraphRunner(self.model, self.backend, self.sampler, self.kv_cache, cfg)
        self.tokens_pinned = torch.zeros(cfg.max_rows, dtype=torch.int64, pin_memory=True)
        self.indptr_pinned = torch.zeros(cfg.max_rows + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(cfg.max_rows, dtype=torch.int32, pin_memory=True)
        self.win_indptr_pinned = torch.zeros(cfg.max_rows + 1, dtype=torch.int32, pin_memory=True)
        self.win_last_pinned = torch.ones(cfg.max_rows, dtype=torch.int32, pin_memory=True)
        self.out_q: "queue.Queue" = queue.Queue()
        self.state = OutputState()
        self.output = OutputThread(self.out_q, self.tokens_pinned, self.state)
        self.seed_journal: List[List[int]] = []

    def start(self) -> None:
        self.runner.capture_all()
        self.output.start()

    def _tables(self, tables: List[np.ndarray], seq_lens: np.ndarray, indptr: torch.Tensor, last: torch.Tensor):
        n = len(tables)
        ps = self.cfg.page_size
        ind = indptr.numpy()
        ind[0] = 0
        np.cumsum([len(t) for t in tables], out=ind[1 : n + 1])
        last.numpy()[:n] = (seq_lens - 1) % ps + 1
        flat = torch.from_numpy(np.concatenate(tables).astype(np.int32)).to(self.device, non_blocking=True)
        return indptr[: n + 1], flat, last[:n]

    def inputs_from(self, sched: DecodeSchedule) -> DecodeInputs:
        indptr, indices, last = self._tables(sched.page_tables, sched.seq_lens, self.indptr_pinned, self.last_pinned)
        w_indptr, w_indices, w_last = self._tables(
            sched.window_page_tables, sched.seq_lens, self.win_indptr_pinned, self.win_last_pinned
        )
        positions = torch.from_numpy(sched.seq_lens.astype(np.int64) - 1).to(self.device, non_blocking=True)
        return DecodeInputs(
            kv_indptr=indptr.to(self.device, non_blocking=True),
            kv_indptr_host=indptr,
            kv_indices=indices,
            last_page_len_host=last,
            positions=positions,
            window_indptr_host=w_indptr,
            window_indices=w_indices,
            window_last_page_len_host=w_last,
        )

    def prefill(self, meta: PrefillInputs, input_ids: torch.Tensor, positions, slots, last_rows) -> torch.Tensor:
        self.backend.plan_prefill(meta)
        return self.model.forward_prefill(input_ids, positions, self.kv_cache, slots, last_rows)

    def step(self, sched: DecodeSchedule) -> Optional[List[int]]:
        staged = self.stager.stage(sched.requests)
        meta = self.inputs_from(sched)
        ids = torch.from_numpy(sched.input_ids).to(self.device, non_blocking=True)
        slots = torch.from_numpy(sched.slots).to(self.device, non_blocking=True)
        bs = self.runner.bucket_for(staged.num_rows)
        if bs is None:
            out = self.runner.run_eager(meta, staged, ids, slots)
        else:
            out = self.runner.replay(bs, meta, staged, ids, slots)
        if sched.record_seeds:
            self.seed_journal.append([int(s) for s in staged.seeds])  # expect: FC101
        if sched.no_page_crossing and bs is not None:
            # no row crosses a page: advance the bound last-page lengths for the next append
            self.backend.last_page_len_buf[: out.num_rows].add_(1)  # expect: FC104
        self.tokens_pinned[: out.num_rows].copy_(out.tokens, non_blocking=True)
        if self.cfg.async_output:
            done = torch.cuda.Event()
            done.record()
            self.out_q.put((done, out.num_rows, sched.request_ids))
            return None
        return self.tokens_pinned[: out.num_rows].tolist()  # expect: FC101
