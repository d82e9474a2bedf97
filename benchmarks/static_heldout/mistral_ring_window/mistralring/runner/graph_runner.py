"""Decode CUDA graphs, one per batch bucket, recorded at start-up."""
from __future__ import annotations

import bisect
import logging
from typing import Dict, Optional

import torch

from mistralring.attn.backend import RingWindowBackend
from mistralring.config import MistralRingConfig
from mistralring.model import MistralRingModel
from mistralring.ring_cache import RingBatch, RingKVCache

logger = logging.getLogger(__name__)

# FlashInfer silently drops window_left on some backends; we check what the plan kept
_WINDOW_ATTR = "_window_left"


class DecodeGraphRunner:
    def __init__(self, cfg: MistralRingConfig, model: MistralRingModel, backend: RingWindowBackend,
                 cache: RingKVCache, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.cache = cache
        self.device = device
        gbs = cfg.max_graph_bs
        self.input_ids = torch.zeros(gbs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(gbs, dtype=torch.int64, device=device)
        self.req_slots = torch.zeros(gbs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(gbs, dtype=torch.int32, device=device)
        self.page_counts = torch.ones(gbs, dtype=torch.int32, device=device)
        self.logits = torch.zeros(gbs, cfg.vocab_size, dtype=cfg.dtype, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.cfg.graph_buckets, n)
        return self.cfg.graph_buckets[i] if i < len(self.cfg.graph_buckets) else None

    def _static_batch(self, bs: int) -> RingBatch:
        return RingBatch(
            req_slots=self.req_slots[:bs], seq_lens=self.seq_lens[:bs], seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            kv_page_counts=self.page_counts[:bs], graph_bs=bs,
        )

    def _bind_dummy(self, bs: int) -> None:
        """Plan the bucket for warm-up and capture: one page per request."""
        cfg = self.cfg
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        indices = torch.zeros(bs, dtype=torch.int32, device=self.device)
        last = torch.ones(bs, dtype=torch.int32)
        self.backend.ring_graph[bs].plan(  # ok: FC102
            indptr, indices, last, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            window_left=self.cache.window_left, q_data_type=cfg.dtype,
        )
        self.backend.global_decode.plan(
            indptr, indices, last, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size
        )

    def record_buckets(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.graph_buckets):
            batch = self._static_batch(bs)
            self._bind_dummy(bs)
            for _ in range(2):  # JIT and autotuning outside the capture
                self.logits[:bs] = self.model(self.input_ids[:bs], self.positions[:bs], batch)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.logits[:bs] = self.model(self.input_ids[:bs], self.positions[:bs], batch)
            self.pool = graph.pool()
            self.graphs[bs] = graph
            logger.info(f"recorded ring decode bs={bs}; warm-up logits {self.logits[0, :4]}")  # expect: FC101
        torch.cuda.synchronize()

    def load_bucket(self, batch: RingBatch, bs: int) -> None:
        """Fill the bucket's inputs and plan its ring wrapper for this batch."""
        cfg, b = self.cfg, self.backend
        n = batch.batch_size
        pt = self.cache.build_page_table(batch)
        if self.req_slots.numel() < bs:
            self.req_slots = torch.zeros(bs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.req_slots[:n].copy_(batch.req_slots)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.seq_lens[n:bs].fill_(1)
        self.page_counts[:n].copy_(batch.kv_page_counts)
        # padded rows: one page each, the first page of slot 0; their outputs are dropped
        pad = bs - n
        total = int(pt.indptr_cpu[-1])
        b.kv_indptr_host[: n + 1].copy_(pt.indptr_cpu)
        b.kv_indptr_host[n + 1 : bs + 1] = torch.arange(total + 1, total + pad + 1, dtype=torch.int32)
        b.last_page_len_host[:n].copy_(pt.last_page_len_cpu)
        b.last_page_len_host[n:bs] = 1
        indices = torch.cat([pt.indices, torch.zeros(pad, dtype=torch.int32, device=self.device)])
        b.graph_last_page_len[:n].copy_(pt.last_page_len)  # ok: FC104
        plan = b.ring_graph[bs].plan
        plan(  # ok: FC102
            b.kv_indptr_host[: bs + 1], indices, b.last_page_len_host[:bs],
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            window_left=self.cache.window_left, q_data_type=cfg.dtype,
        )
        wrapper = b.ring_graph[bs]
        if getattr(wrapper, _WINDOW_ATTR, -1) != self.cache.window_left:  # expect: FC103
            raise RuntimeError(f"bucket {bs}: window_left was not kept by the plan")
        g_indptr, g_last = self.cache.global_lens_device(batch)
        _, g_indices, _ = self.cache.global_page_table(batch)
        b.global_decode.plan(  # expect: FC102
            g_indptr, g_indices, g_last,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )
        # the host mirror's padded rows go back to "empty" for the next, smaller bucket
        b.kv_indptr_host[n + 1 :] = total  # ok: FC104

    def replay(
        self, batch: RingBatch, input_ids: torch.Tensor, positions: torch.Tensor, bs: int, reuse_plan: bool = False
    ) -> torch.Tensor:
        n = batch.batch_size
        if reuse_plan:
            # the bound table is only n x ring_pages while every ring is full
            if (batch.kv_page_counts < self.cfg.ring_pages).any():  # expect: FC101
                raise RuntimeError("reuse_plan with a ring that is not full")
        else:
            self.load_bucket(batch, bs)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.graphs[bs].replay()
        return self.logits[:n]
