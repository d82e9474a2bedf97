"""Decode-only CUDA graphs: steps with prefill or connector work run eagerly."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from kvconn.config import GRAPH_WORKSPACE_MB, EngineConfig
from lw_worker.attn_backend import (
    CommonStepInputs,
    FlashInferAttentionBackend,
    FlashInferMetadataBuilder,
    FlashInferStepMetadata,
)
from lw_worker.model import LayerwiseModel, StepBatch


@dataclass
class DecodeGraphEntry:
    graph: torch.cuda.CUDAGraph
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    output: torch.Tensor
    meta: FlashInferStepMetadata


class DecodeGraphRunner:
    def __init__(
        self,
        model: LayerwiseModel,
        backend: FlashInferAttentionBackend,
        builder: FlashInferMetadataBuilder,
        kv_caches: List[torch.Tensor],
        cfg: EngineConfig,
        device: torch.device,
    ):
        self.model = model
        self.backend = backend
        self.builder = builder
        self.kv_caches = kv_caches
        self.cfg = cfg
        self.device = device
        self.sizes = sorted(s for s in cfg.cuda_graph_sizes if s <= cfg.max_num_seqs)
        self.max_bs = self.sizes[-1]
        self.workspace = torch.zeros(GRAPH_WORKSPACE_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.entries: Dict[int, DecodeGraphEntry] = {}
        self.pool = None
        backend.init_graph_buffers()

    def bucket_for(self, n: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def _dummy_common(self, bs: int) -> CommonStepInputs:
        # warm up on a few pages of context per row; every dummy row points at page 0
        pages = self.cfg.cascade_min_prefix_pages
        seq = pages * self.cfg.page_size
        return CommonStepInputs(
            num_reqs=bs,
            num_decodes=bs,
            num_decode_tokens=bs,
            query_start_loc=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            query_start_loc_cpu=torch.arange(bs + 1, dtype=torch.int32),
            seq_lens=torch.full((bs,), seq, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.full((bs,), seq, dtype=torch.int32),
            block_table_np=np.zeros((bs, pages), dtype=np.int32),
            block_table=torch.zeros((bs, pages), dtype=torch.int32, device=self.device),
            slot_mapping=torch.zeros(bs, dtype=torch.int64, device=self.device),
        )

    def capture_all(self) -> None:
        for bs in reversed(self.sizes):
            self.capture_one(bs)

    def capture_one(self, bs: int) -> None:
        be = self.backend
        meta = self.builder.build(self._dummy_common(bs))
        meta.decode_wrapper = be.make_graph_wrapper(bs, self.workspace)
        be.plan_graph_decode(bs, meta)
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        positions = torch.zeros(bs, dtype=torch.int64, device=self.device)
        for _ in range(2):  # warm up outside the graph
            self.model.forward_decode(input_ids, positions, self.kv_caches, meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.model.forward_decode(input_ids, positions, self.kv_caches, meta)
        if self.pool is None:
            self.pool = graph.pool()
        self.entries[bs] = DecodeGraphEntry(graph, bs, input_ids, positions, output, meta)

    def replay(self, fb: StepBatch, meta: FlashInferStepMetadata) -> torch.Tensor:
        n = fb.num_reqs
        bs = self.bucket_for(n)
        entry = self.entries.get(bs)
        be = self.backend
        nnz = int(be.kv_indptr_cpu[n])
        be.kv_indptr_cpu[n + 1 : bs + 1].fill_(nnz)
        be.kv_last_page_len_cpu[n:bs].fill_(1)
        be.plan_graph_decode(bs, meta)
        be.kv_indptr_buf[n + 1 : bs + 1].fill_(nnz)  # expect: FC104
        entry.input_ids[:n].copy_(fb.input_ids)
        entry.input_ids[n:].zero_()  # ok: FC104
        entry.positions = torch.cat([fb.positions, entry.positions[n:]])  # expect: FC107
        entry.graph.replay()
        return entry.output[:n]

    def replay_unplanned(self, fb: StepBatch) -> torch.Tensor:
        """Replay the last bucket again without re-planning (no page boundary was crossed)."""
        n = fb.num_reqs
        entry = self.entries[self.bucket_for(n)]
        entry.input_ids[:n].copy_(fb.input_ids)
        entry.positions[:n].copy_(fb.positions)
        entry.graph.replay()
        return entry.output[:n]
