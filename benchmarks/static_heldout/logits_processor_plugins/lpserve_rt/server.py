"""The serving loop: admission with prompt prefill, the per-step processor pipeline, replay."""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

import flashcheck
from lpserve.attn.decode import DecodeAttention
from lpserve.batch import StepBatch
from lpserve.config import ServeConfig
from lpserve.kv import PagePool
from lpserve.processors.base import GraphLogitsProcessor, HostLogitsProcessor, LogitsProcessorBase
from lpserve.registry import load_plugins, processor_class
from lpserve_rt.graphs import DecodeGraphBank
from lpserve_rt.model import DecoderModel

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    prompt: List[int]
    bad_words: List[List[int]] = field(default_factory=list)
    json_schema: Optional[str] = None
    repetition_penalty: float = 0.0
    max_new_tokens: int = 256
    generated: List[int] = field(default_factory=list)


class LogitsServer:
    def __init__(self, cfg: ServeConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        load_plugins()
        self.pool = PagePool(cfg, self.device)
        self.attn = DecodeAttention(cfg, self.pool, self.device)
        self.model = DecoderModel(cfg, self.attn, self.pool).to(self.device)
        self.procs: List[LogitsProcessorBase] = [
            processor_class(name)(cfg, self.device, self.attn) for name in cfg.processors
        ]
        self.host_procs: List[HostLogitsProcessor] = [p for p in self.procs if not p.runs_in_graph]
        self.graph_procs: List[GraphLogitsProcessor] = [p for p in self.procs if p.runs_in_graph]
        self.graphs = DecodeGraphBank(cfg, self.model, self.attn, self.graph_procs, self.device)
        self.requests: Dict[int, Request] = {}
        self.rows: List[int] = []
        self.waiting: List[Request] = []
        self._last_tokens = torch.zeros(cfg.max_batch_size, dtype=torch.long, device=self.device)
        self._step = 0
        self.outputs: "queue.Queue" = queue.Queue()
        self._output_thread = threading.Thread(target=self._drain_outputs, daemon=True)

    def start(self) -> None:
        self.graphs.record_all()
        self._output_thread.start()

    def add_request(self, req: Request) -> None:
        assert len(req.bad_words) <= self.cfg.max_bad_words  # expect: FC109
        self.waiting.append(req)

    def _check_capacity(self) -> None:
        assert len(self.rows) <= self.cfg.max_batch_size  # ok: FC109

    def _admit(self) -> None:
        room = self.cfg.max_batch_size - len(self.rows)
        if not self.waiting or room <= 0:
            return
        new = self.waiting[:room]
        del self.waiting[: len(new)]
        for req in new:
            self.requests[req.rid] = req
            self.pool.alloc_request(req.rid, len(req.prompt))
            for proc in self.procs:
                proc.add_request(req.rid, req)
            self.rows.append(req.rid)
        self._check_capacity()
        rids = [r.rid for r in new]
        lens = [len(r.prompt) for r in new]
        meta = self.pool.host_metadata(rids)
        self.attn.plan_prompt(
            lens,
            torch.tensor(meta.indptr, dtype=torch.int32),
            torch.tensor(meta.indices, dtype=torch.int32, device=self.device),
            torch.tensor(meta.last_page_len, dtype=torch.int32),
        )
        total = self.pool.stage_prefill_slots(rids, lens)
        ids = torch.tensor([t for r in new for t in r.prompt], dtype=torch.long, device=self.device)
        pos = torch.tensor([p for n in lens for p in range(n)], dtype=torch.long, device=self.device)
        logits = self.model.prefill(ids[:total], pos[:total])
        ends = torch.tensor([sum(lens[: i + 1]) - 1 for i in range(len(lens))], dtype=torch.long, device=self.device)
        rows = torch.tensor([self.rows.index(rid) for rid in rids], dtype=torch.long, device=self.device)
        self._last_tokens.index_copy_(0, rows, torch.argmax(logits.index_select(0, ends), dim=-1))

    def _build_batch(self) -> StepBatch:
        rids = list(self.rows)
        for rid in rids:
            self.pool.advance(rid)
        meta = self.pool.host_metadata(rids)
        self.pool.stage_out_slots(meta)
        lens = [self.pool.lens[rid] for rid in rids]
        return StepBatch(
            num_rows=len(rids),
            rids=rids,
            last_tokens=self._last_tokens,
            positions=torch.tensor([n - 1 for n in lens], dtype=torch.long, device=self.device),
            kv_indptr=torch.tensor(meta.indptr, dtype=torch.int32, device=self.device),
            kv_indices=torch.tensor(meta.indices, dtype=torch.int32, device=self.device),
            last_page_len=torch.tensor(meta.last_page_len, dtype=torch.int32, device=self.device),
            kv_indptr_cpu=torch.tensor(meta.indptr, dtype=torch.int32).pin_memory(),
            last_page_len_cpu=torch.tensor(meta.last_page_len, dtype=torch.int32).pin_memory(),
            indptr_list=meta.indptr,
            last_page_list=meta.last_page_len,
            long_rows=[i for i, n in enumerate(lens) if n > self.cfg.long_context_threshold],
        )

    def _rollback_rows(self, batch: StepBatch) -> None:
        for row in batch.rollback_rows:
            self.pool.rollback(batch.rids[row])
        idx = torch.tensor(batch.rollback_rows, dtype=torch.long, device=self.device)
        minus_one = torch.full((len(batch.rollback_rows),), -1, dtype=torch.int32, device=self.device)
        # keep the graphs' view of the rolled-back rows consistent until the next plan
        self.attn.last_page_len_buf.index_add_(0, idx, minus_one)  # expect: FC104

    @flashcheck.hot_path
    def step(self) -> Optional[torch.Tensor]:
        self._admit()
        if not self.rows:
            return None
        batch = self._build_batch()
        bs = batch.num_rows
        bias = self.graphs.bias[:bs]
        bias.zero_()
        for proc in self.host_procs:
            proc.apply_host(batch, bias)
        for gproc in self.graph_procs:
            gproc.prepare_step(batch)
        next_tok = self.graphs.replay(batch)
        self._last_tokens[:bs].copy_(next_tok)
        finished = (next_tok == self.cfg.eos_token_id).sum()
        logger.info(f"step {self._step}: {finished} rows sampled EOS")  # expect: FC101
        if batch.rollback_rows:
            self._rollback_rows(batch)
        self.outputs.put((list(batch.rids), next_tok.clone()))
        self._step += 1
        return next_tok

    def _drain_outputs(self) -> None:
        while True:
            rids, toks = self.outputs.get()
            host = toks.tolist()
            for proc in self.procs:
                proc.on_tokens(rids, host)
            for rid, tok in zip(rids, host):
                req = self.requests.get(rid)
                if req is not None:
                    req.generated.append(tok)
