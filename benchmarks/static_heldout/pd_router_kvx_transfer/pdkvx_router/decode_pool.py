"""The decode pool: receives KV pages from prefill workers, admits requests once their pages have
landed, and decodes them with graph replays (eager past the largest bucket)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from pdkvx.config import PLAN_STATE_ATTR, PDConfig
from pdkvx.handles import KVTransferHandle
from pdkvx.transport.registry import BaseTransport, make_transport
from pdkvx.utils import PageAllocator, exclusive_cumsum, timed, total_from_indptr
from pdkvx_router.decode_attention import DecodeAttention
from pdkvx_router.model import PDModel, make_kv_cache

logger = logging.getLogger(__name__)


@dataclass
class DecodeRequest:
    request_id: str
    row: int
    seq_len: int
    pages: List[int] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)
    finished: bool = False


class KVReceiver:
    """Tracks transfers the router registered and hands over the ones that landed."""

    def __init__(self, transport: BaseTransport, attn: DecodeAttention, device: torch.device):
        self.transport, self.attn, self.device = transport, attn, device
        self.pending: Dict[str, KVTransferHandle] = {}
        self.inflight_pages = 0
        self.landed_ids: Optional[torch.Tensor] = None
        self.resident_gpu = torch.zeros(attn.cfg.num_pages, dtype=torch.bool, device=device)
        self.transport.on_landed = lambda h: logger.debug("transport landed %s", h.request_id)

    def register(self, handle: KVTransferHandle, dst_pages: List[int]) -> None:
        assert handle.num_pages == len(dst_pages)  # expect: FC109
        self.pending[handle.request_id] = handle
        self.inflight_pages += handle.num_pages

    def poll(self) -> List[KVTransferHandle]:
        landed = self.transport.poll_landed()
        ready = [h for h in landed if h.request_id in self.pending]
        if not ready:
            return []
        compute = torch.cuda.current_stream()
        for h in ready:
            if h.ready_event is None:
                continue
            if h.meta.get("same_device", True):
                compute.wait_event(h.ready_event)  # ok: FC101
            else:
                h.ready_event.synchronize()  # expect: FC101
            logger.debug("landed %s pages=%s", h.request_id, h.page_ids)  # ok: FC101

        counts_gpu = torch.tensor([h.num_pages for h in ready], dtype=torch.int32, device=self.device)
        landed_indptr = exclusive_cumsum(counts_gpu)
        self.inflight_pages -= total_from_indptr(landed_indptr)
        assert self.inflight_pages >= 0  # ok: FC109
        self.landed_ids = torch.cat([h.page_ids for h in ready])  # expect: FC107
        self.resident_gpu[self.landed_ids.long()] = True

        for h in ready:
            # pre-stage the landed pages after the packed tail: no gather before the first replay
            tail = self.attn.packed_tail
            n = h.num_pages
            self.attn.kv_indices[tail : tail + n].copy_(h.page_ids, non_blocking=True)  # expect: FC104
            self.attn.kv_indices_cpu[tail : tail + n].copy_(h.page_ids_cpu)  # ok: FC104
            self.attn.packed_tail = tail + n
            self.pending.pop(h.request_id, None)
        return ready


class DecodeGraphRunner:
    def __init__(self, model: PDModel, attn: DecodeAttention, kv_cache: List[torch.Tensor], device: torch.device):
        self.model, self.attn, self.kv_cache, self.device = model, attn, kv_cache, device
        max_bs = attn.buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.plan_state: Dict[int, object] = {}
        self.pool = None

    def capture_all(self) -> None:
        for bs in reversed(self.attn.buckets):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        attn = self.attn
        w = attn.graph_decode[bs]
        attn.kv_indptr_np[: bs + 1] = np.arange(bs + 1, dtype=np.int32)
        attn.kv_indices_np[:bs] = 0
        attn.last_len_np[:bs] = 1
        attn.active_bucket = bs
        attn.long_context_active = False
        w.plan(attn.kv_indptr_cpu[: bs + 1], attn.kv_indices_cpu[:bs], attn.kv_last_page_len_cpu[:bs],
               attn.num_qo_heads, attn.num_kv_heads, attn.head_dim, attn.page_size, q_data_type=torch.bfloat16)
        attn._plan_window(bs, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model.decode_forward(self.static_input_ids[:bs], self.static_positions[:bs], attn, self.kv_cache)
        self.pool, self.graphs[bs], self.static_logits[bs] = g.pool(), g, logits
        self._remember_plan_state(bs, w)

    def _remember_plan_state(self, bs: int, w) -> None:
        # kept so that a replay after a weight reload can tell whether the plan changed
        self.plan_state[bs] = getattr(w, PLAN_STATE_ATTR, None)  # expect: FC103

    def replay(self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        bucket = self.attn.bucket_for(bs)
        if self.static_positions.shape[0] < bucket:
            self.static_positions = torch.zeros(bucket, dtype=torch.int64, device=self.device)  # expect: FC107
        self.static_input_ids[:bs].copy_(input_ids)
        self.static_positions[:bs].copy_(positions)
        self.graphs[bucket].replay()
        return self.static_logits[bucket][:bs]


class DecodePool:
    def __init__(self, cfg: PDConfig, device: torch.device):
        self.cfg, self.device, max_bs = cfg, device, cfg.max_decode_batch
        self.attn = DecodeAttention(cfg, device)
        self.model = PDModel(cfg.model).to(device)
        self.kv_cache = make_kv_cache(cfg.model, cfg.num_pages, cfg.page_size, device)
        self.allocator = PageAllocator(cfg.num_pages)
        self.transport = make_transport(cfg, device)
        self.receiver = KVReceiver(self.transport, self.attn, device)
        self.graph_runner = DecodeGraphRunner(self.model, self.attn, self.kv_cache, device)

        self.running: List[DecodeRequest] = []
        self.free_rows: List[int] = list(range(max_bs))
        self.row_last_token = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.tokens_pinned = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.rows_pinned = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.next_tokens_buf: Optional[torch.Tensor] = None
        self.last_bs = 0
        self.stats: Dict[str, float] = {}

    def _pick_bucket(self, n: int) -> Optional[int]:
        assert n <= self.cfg.max_decode_batch  # ok: FC109
        return self.attn.bucket_for(n)

    def _admit(self, h: KVTransferHandle) -> None:
        row = self.free_rows.pop()
        pages = h.page_ids_cpu.numpy()
        self.attn.block_table_np[row, : h.num_pages] = pages
        self.attn.block_table_gpu[row, : h.num_pages].copy_(h.page_ids, non_blocking=True)
        self.row_last_token[row] = h.first_token
        self.running.append(DecodeRequest(h.request_id, row, h.seq_len + 1, pages=pages.tolist()))

    @torch.inference_mode()
    def step(self) -> int:
        with timed(self.stats, "poll"):
            for h in self.receiver.poll():
                self._admit(h)
        if not self.running:
            return 0
        bs = len(self.running)
        bucket = self._pick_bucket(bs)
        rows_cpu = [r.row for r in self.running]
        seq_lens_np = np.fromiter((r.seq_len for r in self.running), dtype=np.int32, count=bs)
        self.attn.prepare_decode(rows_cpu, seq_lens_np)
        self.attn.long_context_active = bucket is None and self.attn.max_seq_len_host > self.cfg.long_context_threshold

        self.rows_pinned[:bs] = torch.from_numpy(np.asarray(rows_cpu, dtype=np.int64))
        rows_idx = self.rows_pinned[:bs].to(self.device, non_blocking=True)
        input_ids = self.row_last_token[rows_idx]
        positions = torch.from_numpy(seq_lens_np - 1).to(self.device, non_blocking=True).long()
        if bucket is not None:
            logits = self.graph_runner.replay(bs, input_ids, positions)
        else:
            logits = self.model.decode_forward(input_ids, positions, self.attn, self.kv_cache)

        if self.next_tokens_buf is None:
            self.next_tokens_buf = torch.empty(self.cfg.max_decode_batch, dtype=torch.int64, device=self.device)  # ok: FC107
        next_tokens = self.next_tokens_buf[:bs]
        torch.argmax(logits, dim=-1, out=next_tokens)
        self.row_last_token.index_copy_(0, rows_idx, next_tokens)
        finished = next_tokens == self.cfg.eos_token_id
        done_rows = rows_idx[finished]  # expect: FC101
        self.attn.block_table_gpu.index_fill_(0, done_rows, 0)

        self.tokens_pinned[:bs].copy_(next_tokens, non_blocking=True)
        self.copy_done.record()
        self.last_bs = bs
        for r in self.running:
            r.seq_len += 1
        return bs

    def retire_finished(self) -> List[DecodeRequest]:
        """Called by the router after the step, overlapped with the next routing round."""
        self.copy_done.synchronize()
        for r, t in zip(self.running, self.tokens_pinned[: self.last_bs].tolist()):
            r.output_ids.append(t)
            r.finished = t == self.cfg.eos_token_id
        done = [r for r in self.running if r.finished]
        self.running = [r for r in self.running if not r.finished]
        for r in done:
            self.free_rows.append(r.row)
            self.allocator.free(r.pages)
        return done

    def stats_snapshot(self) -> Dict[str, float]:
        packed = total_from_indptr(self.attn.kv_indptr_cpu)
        return {**self.stats, "packed_pages": float(packed), "free_pages": float(self.allocator.num_free)}

    def dump_inflight(self) -> Dict[str, List[int]]:
        """Admin endpoint: the pages each in-flight transfer will land in."""
        return {rid: h.page_ids.tolist() for rid, h in self.receiver.pending.items()}  # ok: FC101
