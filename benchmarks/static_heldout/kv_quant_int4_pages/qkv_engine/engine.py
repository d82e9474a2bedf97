"""Serving loop of the quantized-KV engine."""
from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Dict, List, Set

import numpy as np
import torch

from qkv.config import QuantKVConfig
from qkv.scales import PageScaleTable
from qkv_engine.attention import DecodeInputs, QuantDecodeAttention
from qkv_engine.graphs import DecodeGraphBank
from qkv_engine.kv.page_pool import Int4PagePool
from qkv_engine.model import QuantLM
from qkv_engine.tracker import ScaleTracker


@dataclasses.dataclass
class Request:
    rid: str
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = dataclasses.field(default_factory=list)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]


class QuantServeEngine:
    def __init__(self, cfg: QuantKVConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.pool = Int4PagePool(cfg, self.device)
        self.scales = PageScaleTable(cfg, self.device)
        self.attn = QuantDecodeAttention(cfg, self.pool, self.scales, self.device)
        self.tracker = ScaleTracker(cfg, self.scales, self.device)
        self.model = QuantLM(cfg, self.attn).to(self.device)
        self.graphs = DecodeGraphBank(self.model, self.attn, cfg)
        self.probe_layer = next(i for i in range(cfg.num_layers) if i not in cfg.fp8_layers)

        max_bs = cfg.max_batch_size
        self.out_tokens = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.stop_mask = torch.zeros(max_bs, dtype=torch.bool, device=self.device)
        self.page_of_row = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.ones_i32 = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.tokens_pinned = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.seq_lens_pinned = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.copy_stream = torch.cuda.Stream()
        self.copy_event = torch.cuda.Event()

        self.requests: Dict[str, Request] = {}
        self.running: List[Request] = []
        self.finished: Set[str] = set()
        self.out_queue: "queue.Queue" = queue.Queue()
        self._drain = threading.Thread(target=self._drain_outputs, daemon=True)
        self._drain.start()

    def add_request(self, rid: str, prompt_ids: List[int], max_new_tokens: int) -> None:
        if not prompt_ids:
            raise ValueError(f"request {rid} has an empty prompt")
        req = Request(rid, list(prompt_ids), max_new_tokens)
        self.pool.allocate(rid, len(prompt_ids))
        self.requests[rid] = req
        self.running.append(req)

    def _build_inputs(self, reqs: List[Request]) -> DecodeInputs:
        seq_lens = np.fromiter((self.pool.seq_len(r.rid) for r in reqs), dtype=np.int32, count=len(reqs))
        slots = np.fromiter((self.pool.append_slot(r.rid) for r in reqs), dtype=np.int64, count=len(reqs))
        return DecodeInputs(
            rids=[r.rid for r in reqs],
            seq_lens_np=seq_lens,
            page_lists=[self.pool.pages(r.rid) for r in reqs],
            append_slots_np=slots,
        )

    def step(self) -> int:
        if self.finished:
            self.running = [r for r in self.running if r.rid not in self.finished]
            for rid in self.finished:
                self.pool.release(rid)
            self.finished.clear()
        reqs = list(self.running)
        raw_bs = len(reqs)
        if raw_bs == 0:
            return 0
        for r in reqs:
            self.pool.append_token(r.rid)
        inputs = self._build_inputs(reqs)
        self.seq_lens_pinned = torch.tensor(inputs.seq_lens_np, dtype=torch.int32).pin_memory()  # ok: FC107
        lens = self.seq_lens_pinned[:raw_bs].tolist()  # ok: FC101
        input_ids = torch.tensor([r.last_token for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True)
        positions = torch.tensor([n - 1 for n in lens], dtype=torch.int64).to(self.device, non_blocking=True)
        last_pages = np.array([p[-1] for p in inputs.page_lists], dtype=np.int64)
        self.page_of_row[:raw_bs].copy_(torch.from_numpy(last_pages), non_blocking=True)

        logits = self.graphs.replay(raw_bs, inputs, input_ids, positions)
        torch.argmax(logits, dim=-1, out=self.out_tokens[:raw_bs])
        torch.eq(self.out_tokens[:raw_bs], self.cfg.eos_token_id, out=self.stop_mask[:raw_bs])
        num_finished = int(self.stop_mask[:raw_bs].sum())  # expect: FC101
        # the token appended this step advances every row's last page
        self.attn.kv_last_page_len[:raw_bs].add_(1)  # expect: FC104
        self.tracker.observe_step(
            self.probe_layer, self.page_of_row[:raw_bs], self.attn.new_amax[:raw_bs], self.ones_i32[:raw_bs], raw_bs
        )

        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.tokens_pinned[:raw_bs].copy_(self.out_tokens[:raw_bs], non_blocking=True)  # ok: FC101
            self.copy_event.record(self.copy_stream)
        self.out_queue.put(([r.rid for r in reqs], raw_bs, self.copy_event))
        return num_finished

    def _drain_outputs(self) -> None:
        while True:
            rids, n, event = self.out_queue.get()
            event.synchronize()
            toks = self.tokens_pinned[:n].tolist()
            for rid, tok in zip(rids, toks):
                req = self.requests[rid]
                req.output_ids.append(tok)
                if tok == self.cfg.eos_token_id or len(req.output_ids) >= req.max_new_tokens:
                    self.finished.add(rid)

    def requantize_pending(self) -> None:
        for layer in self.tracker.pending_requant():
            k_scale, v_scale = self.scales.layer_view(layer)
            self.scales.set_scales(layer, torch.arange(self.cfg.num_pages, device=self.device), k_scale * 2, v_scale * 2)
