"""Decode CUDA graphs, one per batch-size bucket.

Each bucket keeps two metadata values: the snapshot it was captured with (`GraphEntry.snapshot`,
whose tensors the graph reads by address) and the current one (`CudaGraphRunner.current[bs]`, the
`copy.copy` of the snapshot that the last replay planned).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, replace
from typing import Dict, Optional

import torch

from snapattn.flashinfer_backend import FlashInferBackend
from snapserve.batch import BatchState
from snapserve.config import EngineConfig
from snapserve.metadata import DecodeMetadata, DraftMeta, detached
from snapruntime.model import TinyModel

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden: torch.Tensor
    snapshot: DecodeMetadata
    draft: Optional[DraftMeta] = None
    draft_hidden: Optional[torch.Tensor] = None


class CudaGraphRunner:
    def __init__(self, cfg: EngineConfig, model: TinyModel, backend: FlashInferBackend):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.buckets = sorted(cfg.cuda_graph_buckets)
        self.max_bs = self.buckets[-1]
        device = backend.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.entries: Dict[int, GraphEntry] = {}
        self.current: Dict[int, DecodeMetadata] = {}
        self.exported: Dict[int, DecodeMetadata] = {}
        self.pool = None

    # ------------------------------------------------------------------ capture

    def capture_all(self) -> None:
        assert not self.entries, "capture_all() runs once per engine"  # ok: FC109
        self.backend.init_cuda_graph_state(self.max_bs)
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()
        logger.info("captured %d decode graphs (layout %s)", len(self.entries), self.backend._kv_layout)  # ok: FC103

    def capture_one_batch_size(self, bs: int) -> None:
        snap = self.backend.init_forward_metadata_capture_cuda_graph(bs)
        draft = self.backend.captured_draft.get(bs)
        ids, pos = self.input_ids[:bs], self.positions[:bs]

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.model.decode(ids, pos, snap)
        torch.cuda.current_stream().wait_stream(stream)

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self.model.decode(ids, pos, snap)
            draft_hidden = self.model.draft(hidden, pos, draft) if draft is not None else None
        self.pool = graph.pool()
        self.entries[bs] = GraphEntry(
            graph=graph,
            input_ids=ids,
            positions=pos,
            hidden=hidden,
            snapshot=snap,
            draft=draft,
            draft_hidden=draft_hidden,
        )

    # ------------------------------------------------------------------ replay

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def prepare_replay(self, batch: BatchState) -> GraphEntry:
        n = batch.num_reqs
        bs = self.bucket_for(n)
        entry = self.entries[bs]
        entry.input_ids[:n].copy_(batch.input_ids[:n], non_blocking=True)
        entry.input_ids[n:].zero_()
        # padded rows decode at position 0
        entry.positions = torch.cat([batch.positions[:n], self.positions.new_zeros(bs - n)])  # expect: FC107
        cur = self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.current[bs] = cur  # ok: FC107
        return entry

    def replay(self, batch: BatchState) -> torch.Tensor:
        entry = self.prepare_replay(batch)
        entry.graph.replay()
        return entry.hidden[: batch.num_reqs]

    # ------------------------------------------------------------------ tooling

    def export_snapshot(self, bs: int) -> DecodeMetadata:
        """A detached copy of a bucket's captured metadata, for offline replays of the planner."""
        snap = detached(self.entries[bs].snapshot)
        nnz = snap.num_pages()
        snap.kv_indices[nnz:].fill_(-1)  # ok: FC104
        self.exported[bs] = snap
        return snap

    def drop_bucket(self, bs: int) -> None:
        entry = self.entries.pop(bs)
        self.current.pop(bs, None)
        self.backend.captured.pop(bs, None)
        self.backend.captured_draft.pop(bs, None)
        self.backend.graph_wrappers.pop(bs, None)
        del entry.graph

    def current_or_captured(self, bs: int) -> DecodeMetadata:
        cur = self.current.get(bs)
        return cur if cur is not None else replace(self.entries[bs].snapshot)
