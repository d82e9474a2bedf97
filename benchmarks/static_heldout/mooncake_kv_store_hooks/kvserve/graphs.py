"""Decode graphs per bucket (largest first, one pool) and their replay."""

from __future__ import annotations

import bisect
import logging
from typing import Dict

import numpy as np
import torch

from kvserve.attention import StoreAwareFlashInferBackend
from kvserve.metadata import DecodeMetadata
from kvserve.model import StoreLM
from kvstore import StoreConfig

logger = logging.getLogger(__name__)


class DecodeGraphs:
    def __init__(self, model: StoreLM, backend: StoreAwareFlashInferBackend, cfg: StoreConfig, device) -> None:
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.buckets = sorted(cfg.graph_buckets)
        self.max_bs = self.buckets[-1]
        self.max_pad_rows = cfg.max_pad_rows
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_slot_mapping = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self._pad_slots = torch.zeros(self.max_bs, dtype=torch.int64, device=device)  # null page, slot 0
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def _capture_meta(self, bs: int) -> DecodeMetadata:
        ones = np.ones(bs, dtype=np.int32)
        return DecodeMetadata(
            batch_size=bs,
            max_seq_len=1,
            req_ids=list(range(bs)),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            page_lists=[np.zeros(1, dtype=np.int32) for _ in range(bs)],
            block_table=torch.zeros(bs, 1, dtype=torch.int32, device=self.device),
            kv_indptr_np=np.arange(bs + 1, dtype=np.int32),
            kv_last_page_len_np=ones,
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            input_ids=self.static_input_ids[:bs],
            positions=torch.zeros(bs, dtype=torch.int64, device=self.device),
            out_cache_loc=self.static_slot_mapping[:bs],
        )

    def capture_all(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        meta = self._capture_meta(bs)
        self.backend.prepare_decode(bs, bs, meta)
        w = self.backend.graph_wrappers[bs]
        if w._paged_kv_indices_buf.data_ptr() != self.backend.kv_indices.data_ptr():  # expect: FC103
            raise RuntimeError(f"bucket {bs}: wrapper does not read the shared kv_indices buffer")
        for _ in range(2):
            self.model.forward_decode(self.static_input_ids[:bs], self.static_slot_mapping[:bs], meta)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bs] = self.model.forward_decode(
                self.static_input_ids[:bs], self.static_slot_mapping[:bs], meta
            )
        self.graphs[bs] = graph

    def bucket_for(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def replay(self, meta: DecodeMetadata) -> torch.Tensor:
        bs = meta.batch_size
        padded = self.bucket_for(bs)
        self.static_input_ids[:bs].copy_(meta.input_ids, non_blocking=True)
        self.static_input_ids[bs:padded].zero_()
        self.static_slot_mapping = torch.cat([meta.out_cache_loc, self._pad_slots[: padded - bs]])  # expect: FC107
        if padded - bs > self.max_pad_rows:
            logger.warning(f"padding {padded - bs} rows; longest sequence {meta.seq_lens.max()}")  # expect: FC101
        logger.debug("replay bs=%d padded=%d lens=%s", bs, padded, meta.seq_lens)  # ok: FC101
        self.backend.prepare_decode(bs, padded, meta)
        bufs = self.backend.graph_bufs
        bufs["kv_last_page_len"][bs:padded].fill_(1)  # expect: FC104
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
