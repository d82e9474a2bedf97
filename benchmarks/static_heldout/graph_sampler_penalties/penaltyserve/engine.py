"""The decode loop: stage penalties and sampling rows, replay (or run eagerly), copy ids out."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

from penaltyserve.attn.backend import DecodeAttnBackend, DecodeInputs
from penaltyserve.config import EngineConfig, ProcessorKind, SamplingParams
from penaltyserve.graphs.runner import DecodeGraphRunner
from penaltyserve.model import PenaltyLM
from penaltyserve.sampling.penalties import PenaltyState
from penaltyserve.sampling.sampler import GraphSampler

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: str
    slot: int
    params: SamplingParams
    pages: List[int] = field(default_factory=list)
    seq_len: int = 0
    last_token: int = 0


class PenaltyEngine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.backend = DecodeAttnBackend(cfg)
        self.model = PenaltyLM(cfg, self.backend).to(cfg.device)
        self.penalties = PenaltyState(cfg)
        self.sampler = GraphSampler(cfg, self.penalties)
        self.runner = DecodeGraphRunner(cfg, self.model, self.backend, self.sampler)
        self.running: List[Request] = []
        max_bs = cfg.max_batch_size
        self.input_ids_cpu = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.input_ids_dev = torch.zeros(max_bs, dtype=torch.int64, device=cfg.device)
        self.page_counts_dev = torch.zeros(max_bs, dtype=torch.int32, device=cfg.device)
        self.page_counts_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.next_ids_pinned = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_table_np = np.zeros((max_bs, cfg.max_pages_per_req), dtype=np.int32)
        self.copy_done = torch.cuda.Event()
        self.step_metrics: Dict[str, int] = {}
        self.backend.init_graph_wrappers()
        self.runner.record_all()

    def _page_table(self, bs: int):
        cfg = self.cfg
        indptr = np.zeros(bs + 1, dtype=np.int32)
        last = np.zeros(bs, dtype=np.int32)
        for i, r in enumerate(self.running[:bs]):
            indptr[i + 1] = indptr[i] + len(r.pages)
            last[i] = (r.seq_len - 1) % cfg.page_size + 1
        indices = np.fromiter((p for r in self.running[:bs] for p in r.pages), dtype=np.int32, count=int(indptr[bs]))
        return indptr, indices, last

    def step(self) -> None:
        bs = len(self.running)
        if bs == 0:
            return
        slots_np = np.array([r.slot for r in self.running], dtype=np.int64)
        indptr_np, indices_np, last_np = self._page_table(bs)
        for i, r in enumerate(self.running):
            self.input_ids_cpu[i] = r.last_token
        bucket = self.runner.bucket_for(bs)
        rows = bucket if bucket is not None else bs
        self.penalties.stage_batch(slots_np, rows)
        self.sampler.load(slots_np, rows)
        kind = self.sampler.batch_kind(slots_np.tolist())
        if self.penalties.any_penalty(slots_np):
            self.step_metrics["penalized_rows"] = self.penalties.num_penalized
        eager_sampling = bool(kind & (ProcessorKind.SEEDED | ProcessorKind.MIN_P))
        if bucket is not None and not eager_sampling:
            next_ids = self.runner.replay(bucket, bs, self.input_ids_cpu, indptr_np, indices_np, last_np)
        else:
            logits = self._eager_forward(bs, indptr_np, indices_np, last_np)
            next_ids = self.sampler.sample_eager(logits, [r.rid for r in self.running], kind)
        self.penalties.record_tokens(next_ids, bs)
        self.next_ids_pinned[:bs].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.copy_done.record()

    def _eager_forward(self, bs: int, indptr_np: np.ndarray, indices_np: np.ndarray, last_np: np.ndarray) -> torch.Tensor:
        backend = self.backend
        nnz = int(indptr_np[bs])
        self.page_counts_cpu[:bs] = torch.from_numpy(np.diff(indptr_np))
        self.page_counts_dev[:bs].copy_(self.page_counts_cpu[:bs], non_blocking=True)
        backend.kv_indices_dev[:nnz].copy_(torch.from_numpy(indices_np).pin_memory(), non_blocking=True)
        backend.kv_last_page_len_dev[:bs].copy_(torch.from_numpy(last_np).pin_memory(), non_blocking=True)
        if backend.trtllm_ws is not None:
            for i, r in enumerate(self.running):
                self.seq_lens_cpu[i] = r.seq_len
                self.block_table_np[i, : len(r.pages)] = r.pages
            backend.seq_lens_dev[:bs].copy_(self.seq_lens_cpu[:bs], non_blocking=True)
            backend.block_tables[:bs].copy_(torch.from_numpy(self.block_table_np[:bs]), non_blocking=True)
        # the eager path borrows the graph indptr rather than keeping a second one
        torch.cumsum(self.page_counts_dev[:bs], 0, out=backend.kv_indptr_buf[1 : bs + 1])  # expect: FC104
        inp = DecodeInputs(
            kv_indptr=backend.kv_indptr_buf[: bs + 1],
            kv_indices=backend.kv_indices_dev[:nnz],
            kv_last_page_len=backend.kv_last_page_len_dev[:bs],
            batch_size=bs,
        )
        backend.plan_eager_decode(inp)
        self.input_ids_dev[:bs].copy_(self.input_ids_cpu[:bs], non_blocking=True)
        max_seq_len = max(r.seq_len for r in self.running)
        return self.model.forward_eager(self.input_ids_dev[:bs], max_seq_len)

    # ------------------------------------------------------------ admission
    def add_request(self, rid: str, prompt_ids: torch.Tensor, params: SamplingParams, slot: int, pages: List[int]) -> None:
        n = int(prompt_ids.numel())
        qo_cpu = torch.tensor([0, n], dtype=torch.int32).pin_memory()
        kv_cpu = torch.tensor([0, len(pages)], dtype=torch.int32).pin_memory()
        last_cpu = torch.tensor([(n - 1) % self.cfg.page_size + 1], dtype=torch.int32).pin_memory()
        self.backend.kv_indices_dev[: len(pages)].copy_(torch.tensor(pages, dtype=torch.int32), non_blocking=True)
        # planned here, run by the prefill worker before the request joins the decode batch
        self.backend.plan_prefill(qo_cpu, kv_cpu, last_cpu)
        self.penalties.add_request(rid, slot, prompt_ids, params)
        self.sampler.add_request(rid, slot, params)
        self.running.append(Request(rid=rid, slot=slot, params=params, pages=list(pages), seq_len=n))

    def finish(self, rid: str) -> None:
        self.penalties.remove_request(rid)
        self.sampler.generators.pop(rid, None)
        self.running = [r for r in self.running if r.rid != rid]
