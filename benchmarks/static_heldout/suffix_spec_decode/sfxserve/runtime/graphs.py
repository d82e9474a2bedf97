"""One CUDA graph per batch-size bucket for the verify forward."""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch

from sfxserve.attention.batch import VerifyBatch
from sfxserve.attention.verify_backend import VerifyAttention
from sfxserve.config import SpecConfig
from sfxserve.model import SpecModel

logger = logging.getLogger(__name__)


@dataclass
class VerifyGraph:
    graph: torch.cuda.CUDAGraph
    bucket: int
    num_tokens: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class VerifyGraphPool:
    def __init__(self, cfg: SpecConfig, model: SpecModel, attn: VerifyAttention, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.device = device
        self.buckets = sorted(cfg.graph_buckets)
        max_tokens = cfg.verify_tokens(self.buckets[-1])
        self.static_input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=self.device)
        self.static_positions = torch.zeros(max_tokens, dtype=torch.int64, device=self.device)
        self.static_seq_lens = torch.full((self.buckets[-1],), cfg.max_draft_len + 1, dtype=torch.int32, device=self.device)
        self.graphs: Dict[int, VerifyGraph] = {}
        self.mempool = None
        self.capture_stream = torch.cuda.Stream()

    def bucket_for(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, bs)
        return self.buckets[i] if i < len(self.buckets) else None

    def has_bucket(self, bs: int) -> bool:
        return self.bucket_for(bs) is not None

    # -- recording ---------------------------------------------------------------------

    def record_all(self) -> None:
        self.attn.init_verify_graphs(self.buckets)
        for bucket in reversed(self.buckets):
            self.record_bucket(bucket)
        logger.info("recorded %d verify graphs", len(self.graphs))

    def _dummy_batch(self, bucket: int, max_len: int) -> VerifyBatch:
        step = self.cfg.max_draft_len + 1
        pages = (max_len + self.cfg.page_size - 1) // self.cfg.page_size
        qo = np.arange(bucket + 1, dtype=np.int32) * step
        kv = np.arange(bucket + 1, dtype=np.int32) * pages
        last = np.full(bucket, (max_len - 1) % self.cfg.page_size + 1, dtype=np.int32)
        n = bucket * step
        return VerifyBatch(
            batch_size=bucket,
            num_tokens=n,
            input_ids=self.static_input_ids[:n],
            positions=self.static_positions[:n],
            seq_lens=self.static_seq_lens[:bucket],
            kv_indices=torch.zeros(bucket * pages, dtype=torch.int32, device=self.device),
            kv_last_page_len=torch.from_numpy(last).to(self.device),
            qo_indptr_cpu=torch.from_numpy(qo),
            kv_indptr_cpu=torch.from_numpy(kv),
            kv_last_page_len_cpu=torch.from_numpy(last),
            max_seq_len=max_len,
        )

    def record_bucket(self, bucket: int) -> None:
        n = self.cfg.verify_tokens(bucket)
        max_len = int(self.static_seq_lens[:bucket].max())  # expect: FC101
        self.attn.prepare_bucket(bucket, self._dummy_batch(bucket, max_len))
        for _ in range(2):
            self.model.verify_forward(self.static_input_ids[:n], self.static_positions[:n], bucket)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool, stream=self.capture_stream):
            logits = self.model.verify_forward(self.static_input_ids[:n], self.static_positions[:n], bucket)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bucket] = VerifyGraph(
            graph, bucket, n, self.static_input_ids[:n], self.static_positions[:n], logits
        )

    # -- per step ----------------------------------------------------------------------

    def replay(self, batch: VerifyBatch) -> torch.Tensor:
        bucket = self.bucket_for(batch.batch_size)
        entry = self.graphs[bucket]
        if (batch.seq_lens > self.cfg.max_context_len).any():  # expect: FC101
            raise RuntimeError("a verified row would pass max_context_len")
        n = batch.num_tokens
        entry.input_ids[:n].copy_(batch.input_ids)
        entry.positions = batch.positions.clone()  # expect: FC107
        self.attn.prepare_bucket(bucket, batch)
        entry.graph.replay()
        return entry.logits[:n]
