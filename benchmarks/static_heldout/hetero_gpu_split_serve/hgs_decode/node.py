"""Decode loop on the large GPU, and the wiring of the two-GPU server."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from benchmarks_support.warmup import WarmupRunner
from hgs.config import ClusterConfig, ModelDims
from hgs.devices import DeviceContext, make_device_context, memory_report
from hgs.kv_transfer import Arrival, KVReceiver, KVSender
from hgs.model import HeteroLM
from hgs_decode.attention import DecodeAttention, DecodeMeta
from hgs_decode.graphs import DecodeGraphPool
from hgs_prefill.node import PrefillNode


@dataclass
class DecodeSeq:
    req_id: int
    row: int
    page_ids: List[int]
    seq_len: int
    generated: List[int] = field(default_factory=list)


class DecodeNode:
    def __init__(self, cfg: ClusterConfig, dims: ModelDims, ctx: DeviceContext, model: HeteroLM):
        self.cfg = cfg
        self.dims = dims
        self.ctx = ctx
        self.dev = ctx.device
        self.model = model
        self.attn = DecodeAttention(cfg, dims, ctx)
        self.graphs = DecodeGraphPool(model, self.attn, ctx, cfg)
        self.receiver = KVReceiver(cfg, self.attn, ctx)
        self.running: List[DecodeSeq] = []
        self.free_rows = list(range(cfg.max_decode_seqs))
        self.block_table = torch.zeros(cfg.max_decode_seqs, cfg.max_pages_per_seq, dtype=torch.int32, device=self.dev)
        self.last_tokens = torch.zeros(cfg.max_decode_seqs, dtype=torch.int64, device=self.dev)
        self.prev_tokens: Optional[torch.Tensor] = None
        self.out_host = torch.zeros(cfg.max_decode_seqs, dtype=torch.int64, pin_memory=True)
        self.out_event = torch.cuda.Event()
        self.finished: "queue.Queue[DecodeSeq]" = queue.Queue()
        self.emitted: "queue.Queue[Tuple[List[DecodeSeq], torch.cuda.Event]]" = queue.Queue()

    def _admit_arrivals(self) -> None:
        while not self.receiver.landed.empty():
            a: Arrival = self.receiver.landed.get_nowait()
            # the pages were copied on the prefill GPU's copy stream; order our stream after them
            self.ctx.compute_stream.wait_event(a.ready)  # ok: FC101
            row = self.free_rows.pop()
            self.block_table[row, : len(a.page_ids)].copy_(torch.tensor(a.page_ids, dtype=torch.int32), non_blocking=True)
            self.last_tokens[row] = a.first_token
            self.running.append(DecodeSeq(a.req_id, row, a.page_ids, a.prompt_len))

    def _pick_bucket(self, n: int) -> Optional[int]:
        assert n > 0  # ok: FC109
        return next((bs for bs in self.cfg.decode_buckets if bs >= n), None)

    def _build_meta(self) -> DecodeMeta:
        ps, dev, n = self.cfg.page_size, self.dev, len(self.running)
        indptr = np.zeros(n + 1, dtype=np.int32)
        last = np.zeros(n, dtype=np.int32)
        indices: List[int] = []
        pos, loc, rows = [], [], []
        for i, s in enumerate(self.running):
            kv_len = s.seq_len + 1
            npg = (kv_len + ps - 1) // ps
            if npg > len(s.page_ids):
                s.page_ids.extend(self.receiver.reserve(1))
                self.block_table[s.row, npg - 1] = s.page_ids[-1]
            indices.extend(s.page_ids[:npg])
            indptr[i + 1] = indptr[i] + npg
            last[i] = kv_len - (npg - 1) * ps
            pos.append(s.seq_len)
            loc.append(s.page_ids[s.seq_len // ps] * ps + s.seq_len % ps)
            rows.append(s.row)
        rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
        return DecodeMeta(
            num_reqs=n,
            num_pages=int(indptr[n]),
            indptr_np=indptr,
            last_page_len_np=last,
            indices=torch.tensor(indices, dtype=torch.int32, device=dev),
            rows=rows_t,
            input_ids=self.last_tokens.index_select(0, rows_t),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            out_loc=torch.tensor(loc, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor([p + 1 for p in pos], dtype=torch.int32, device=dev),
            block_tables=self.block_table.index_select(0, rows_t),
            max_seq_len=max(pos) + 1,
        )

    def _retire(self, done: List[DecodeSeq]) -> None:
        rows = [s.row for s in done]
        pages = torch.unique(self.block_table[rows].flatten())  # expect: FC101
        self.receiver.release_pages(pages, [p for s in done for p in s.page_ids])
        self.block_table[rows] = 0
        self.free_rows.extend(rows)
        self.running = [s for s in self.running if s not in done]

    def step(self) -> None:
        self._admit_arrivals()
        done: List[DecodeSeq] = []
        while not self.finished.empty():
            done.append(self.finished.get_nowait())
        if done:
            self._retire(done)
        if not self.running:
            return
        n = len(self.running)
        bs = self._pick_bucket(n) if self.cfg.enable_graphs else None
        meta = self._build_meta()
        with torch.cuda.stream(self.ctx.compute_stream):
            if bs is not None:
                self.attn.prepare_replay(bs, meta)
                logits, _draft = self.graphs.replay(bs, meta)
            else:
                logits, _draft = self.model.decode(meta.input_ids, meta.positions, meta.out_loc, self.attn, None, meta)
            next_ids = torch.argmax(logits, dim=-1)
            self.last_tokens.index_copy_(0, meta.rows, next_ids)
            # the next step's MTP verification compares its input against this step's draft
            self.prev_tokens = next_ids.clone()  # expect: FC107
            self.out_host[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
            self.out_event.record()
        for s in self.running:
            s.seq_len += 1
        self.emitted.put((list(self.running), self.out_event))


def build_server(cfg: ClusterConfig, dims: ModelDims) -> Tuple[PrefillNode, DecodeNode]:
    decode_ctx = make_device_context(cfg.decode_device, cfg.decode_workspace_bytes(dims), backend=cfg.decode_backend, with_graphs=True)
    prefill_ctx = make_device_context(cfg.prefill_device, cfg.prefill_workspace_bytes(dims))
    if decode_ctx._backend != "trtllm-gen":  # ok: FC103
        raise ValueError(f"decode GPU backend {decode_ctx._backend!r}: batches past the buckets need trtllm-gen")
    decode_model = HeteroLM(dims, with_mtp=True).to(decode_ctx.device, dims.dtype)
    decode_model.allocate_kv(cfg.decode_pages, cfg.page_size, decode_ctx.device)
    prefill_model = HeteroLM(dims, with_mtp=False).to(prefill_ctx.device, dims.dtype)
    prefill_model.allocate_kv(cfg.prefill_pages, cfg.page_size, prefill_ctx.device)
    decode = DecodeNode(cfg, dims, decode_ctx, decode_model)
    sender = KVSender(prefill_model, decode_model, prefill_ctx, decode.receiver)
    prefill = PrefillNode(cfg, dims, prefill_ctx, prefill_model, sender)
    WarmupRunner(prefill, [cfg.chunk_size // 4, cfg.chunk_size // 2, cfg.chunk_size]).run()
    decode.graphs.capture_all(lambda bs: _dummy_meta(decode, bs))
    report = memory_report({"mtp": decode.attn.mtp_wrapper, "prefill_paged": prefill.paged})
    print("flashinfer scratch bytes:", report)
    return prefill, decode


def _dummy_meta(node: DecodeNode, bs: int) -> DecodeMeta:
    dev = node.dev
    return DecodeMeta(
        num_reqs=bs,
        num_pages=bs,
        indptr_np=np.arange(bs + 1, dtype=np.int32),
        last_page_len_np=np.ones(bs, dtype=np.int32),
        indices=torch.zeros(bs, dtype=torch.int32, device=dev),
        rows=torch.arange(bs, device=dev),
        input_ids=torch.zeros(bs, dtype=torch.int64, device=dev),
        positions=torch.zeros(bs, dtype=torch.int64, device=dev),
        out_loc=torch.zeros(bs, dtype=torch.int64, device=dev),
        seq_lens=torch.ones(bs, dtype=torch.int32, device=dev),
        block_tables=torch.zeros(bs, 1, dtype=torch.int32, device=dev),
        max_seq_len=1,
    )
