"""The co-located engine: a prefill batch and a decode batch per step, each on its own stream."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

from colo import PAGE_SIZE, EngineConfig, OutputMerger, StreamPair, build_decode_batch, build_prefill_batch
from colo_attn.decode_attn import DecodeAttention
from colo_attn.prefill_attn import PrefillAttention
from colo_run.graphs import DecodeGraphs
from colo_run.model import ColoModel


@dataclass
class Request:
    rid: int
    prompt: List[int]
    prefix_len: int = 0
    pages: List[int] = field(default_factory=list)
    pages_dev: torch.Tensor = None
    slot: int = -1
    last_token: int = -1
    seq_len: int = 0


class ColocatedEngine:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.streams = StreamPair(device, cfg.decode_stream_priority)
        self.prefill_attn = PrefillAttention(cfg, device)
        self.decode_attn = DecodeAttention(cfg, device)
        self.model = ColoModel(cfg, self.prefill_attn, self.decode_attn).to(device)
        kv_shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(kv_shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.graphs = DecodeGraphs(
            self.model, self.decode_attn, self.kv_caches, cfg.decode_buckets, self.streams.decode, device
        )
        max_bs = self.graphs.max_bs
        self.prefill_tokens_host = torch.empty(cfg.max_prefill_reqs, dtype=torch.int64, pin_memory=True)
        self.decode_tokens_host = torch.empty(max_bs, dtype=torch.int64, pin_memory=True)
        self.slot_offsets_np = np.arange(max_bs + 1, dtype=np.int64) * cfg.max_pages_per_seq
        self.waiting: List[Request] = []
        self.running: Dict[int, Request] = {}
        self.merger = OutputMerger()
        self.merger.start()
        self.graphs.record()

    # ---- bookkeeping --------------------------------------------------------------------------
    def _free_slot(self) -> int:
        used = {r.slot for r in self.running.values()}
        return next(s for s in range(self.graphs.max_bs) if s not in used)

    def _admit(self, req: Request) -> None:
        """The request finished prefill: publish its pages to the decode side's index buffer."""
        req.slot = self._free_slot()
        start = int(self.slot_offsets_np[req.slot])
        self.decode_attn.kv_indices[start : start + req.pages_dev.numel()].copy_(req.pages_dev, non_blocking=True)  # expect: FC104
        self.running[req.rid] = req

    def _flat_pages(self, reqs: List[Request]) -> np.ndarray:
        return np.concatenate([np.asarray(r.pages[: (r.seq_len + PAGE_SIZE - 1) // PAGE_SIZE], np.int32) for r in reqs])

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> None:
        admitted = self.waiting[: self.cfg.max_prefill_reqs]
        self.waiting = self.waiting[len(admitted) :]
        if admitted:
            pbatch = build_prefill_batch(
                [r.rid for r in admitted],
                [r.prompt for r in admitted],
                [r.prefix_len for r in admitted],
                [r.pages for r in admitted],
                PAGE_SIZE,
                self.cfg.max_pages_per_seq,
                self.device,
            )
            m = len(admitted)
            last_idx = pbatch.qo_indptr[1:] - 1
            with torch.cuda.stream(self.streams.prefill):
                self.prefill_attn.plan_prefill(pbatch)
                first = self.model.forward_prefill(pbatch.input_ids, last_idx, self.kv_caches)
                self.prefill_tokens_host[:m].copy_(first, non_blocking=True)
                self.streams.prefill_done.record(self.streams.prefill)
            first_ids = self.prefill_tokens_host[:m].tolist()  # expect: FC101
            self.merger.add_first_tokens(pbatch.rids, first_ids)
            self.streams.handoff_to_decode()
            for req, tok in zip(admitted, first_ids):
                req.last_token, req.seq_len = tok, len(req.prompt) + 1
                self._admit(req)

        decode_reqs = list(self.running.values())[: self.graphs.max_bs]
        if not decode_reqs:
            return
        n = len(decode_reqs)
        dbatch = build_decode_batch(
            [r.rid for r in decode_reqs],
            [r.last_token for r in decode_reqs],
            [r.seq_len for r in decode_reqs],
            self._flat_pages(decode_reqs),
            self.device,
        )
        self.streams.order_decode_after_prefill()
        with torch.cuda.stream(self.streams.decode):
            bs = self.graphs.bucket_for(n)
            logits = self.graphs.replay(dbatch, bs)
            tokens = logits.argmax(dim=-1)
            self.decode_tokens_host[:n].copy_(tokens, non_blocking=True)  # ok: FC101
            self.streams.decode_done.record(self.streams.decode)
            # Advance every row by one token for the next step's plan.
            self.decode_attn.kv_last_page_len[:n] = self.decode_attn.kv_last_page_len[:n] % PAGE_SIZE + 1  # expect: FC104
        self.merger.submit(self.decode_tokens_host, n, self.streams.decode_done, dbatch.rids)
        for r in decode_reqs:
            r.seq_len += 1

    def workspace_report(self) -> Dict[str, int]:
        return {
            "prefill_int_ws": self.prefill_attn.wrapper._int_workspace_buffer.numel(),  # expect: FC103
            "prefill_float_ws": self.prefill_attn.workspace.numel(),
            "decode_graph_ws": self.decode_attn.graph_workspace.numel(),
        }
