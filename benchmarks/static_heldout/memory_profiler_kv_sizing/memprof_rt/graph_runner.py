"""Decode graphs per bucket, captured largest first into one pool until the profiler's graph budget is spent."""

from __future__ import annotations

import bisect
import gc
import logging
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from memprof.limits import EngineLimits
from memprof_rt.attn_backend import FlashInferBackend
from memprof_rt.metadata import StepMetadata
from memprof_rt.model import TinyDecoder

logger = logging.getLogger(__name__)


@dataclass
class BucketRecord:
    graph: torch.cuda.CUDAGraph
    batch_size: int
    logits: torch.Tensor
    pool_bytes: int


class BucketGraphRunner:
    def __init__(
        self, model: TinyDecoder, backend: FlashInferBackend, limits: EngineLimits, device: torch.device
    ) -> None:
        self.model = model
        self.backend = backend
        self.limits = limits
        self.device = device
        self.max_bs = limits.max_num_seqs
        self.page_size = limits.page_size
        self.records: Dict[int, BucketRecord] = {}
        self.buckets: List[int] = []
        self.mempool = None
        n = self.max_bs
        self.static_input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(n, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.static_qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.static_block_table = torch.zeros(n, limits.max_pages_per_seq, dtype=torch.int32, device=device)

    @property
    def max_captured(self) -> int:
        return self.buckets[-1] if self.buckets else 0

    def bucket_for(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def _static_metadata(self, bs: int, lens_np: np.ndarray, page_table_np: np.ndarray) -> StepMetadata:
        seq_lens_cpu = torch.from_numpy(lens_np.astype(np.int32)).pin_memory()
        return StepMetadata(
            batch_size=bs,
            is_prefill=False,
            num_tokens=bs,
            max_seq_len=int(lens_np.max()),
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr=self.static_qo_indptr[: bs + 1],
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            block_table=self.static_block_table[:bs],
            page_table_np=page_table_np,
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            out_cache_loc=self.static_out_loc[:bs],
        )

    # ---------------------------------------------------------------- capture

    def capture_buckets(self, budget_bytes: int) -> List[int]:
        torch.cuda.synchronize(self.device)  # ok: FC101
        self.mempool = torch.cuda.graph_pool_handle()
        free_start, _ = torch.cuda.mem_get_info(self.device)
        captured = []
        for bs in sorted(self.limits.graph_buckets, reverse=True):
            if bs > self.max_bs:
                continue
            free_now, _ = torch.cuda.mem_get_info(self.device)
            if free_start - free_now > budget_bytes:
                logger.warning("graph budget of %d MiB spent; smaller batches pad up", budget_bytes >> 20)
                break
            self.records[bs] = self._capture_one(bs, free_now)
            captured.append(bs)
            gc.collect()
            torch.cuda.empty_cache()
        self.buckets = sorted(captured)
        return self.buckets

    def _capture_one(self, bs: int, free_before: int) -> BucketRecord:
        lens = np.ones(bs, dtype=np.int32)
        table = np.zeros((bs, self.limits.max_pages_per_seq), dtype=np.int32)
        meta = self._static_metadata(bs, lens, table)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, meta)
        out = None
        for _ in range(2):
            out = self.model.forward_decode(meta)
        nan_rows = torch.isnan(out).any(dim=-1).sum().item()  # expect: FC101
        if nan_rows:
            logger.warning("bucket %d: %d warm-up rows produced NaN logits", bs, nan_rows)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.forward_decode(meta)
        free_after, _ = torch.cuda.mem_get_info(self.device)
        return BucketRecord(graph=graph, batch_size=bs, logits=logits, pool_bytes=free_before - free_after)

    # ----------------------------------------------------------------- replay

    def replay(self, meta: StepMetadata) -> torch.Tensor:
        bs = meta.batch_size
        padded = self.bucket_for(bs)
        rec = self.records[padded]
        self.static_input_ids[:bs].copy_(meta.input_ids, non_blocking=True)
        self.static_positions[:bs].copy_(meta.positions, non_blocking=True)
        self.static_out_loc[:bs].copy_(meta.out_cache_loc, non_blocking=True)
        self.static_out_loc[bs:padded].fill_(0)
        self.static_seq_lens[:bs].copy_(meta.seq_lens, non_blocking=True)
        self.static_seq_lens[bs:padded].fill_(1)
        self.static_block_table[:bs].copy_(meta.block_table, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, padded, meta)
        rec.graph.replay()
        # keep this step's logits alive while the sampler runs on them
        rec.logits = rec.logits[:bs].clone()  # expect: FC107
        return rec.logits
