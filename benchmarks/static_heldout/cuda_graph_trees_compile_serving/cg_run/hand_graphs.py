from dataclasses import dataclass
from typing import Dict, Optional

import torch

from cgt import PaddedView, ServingConfig
from cg_attn.backend import GraphTreeAttnBackend
from cg_attn.metadata import DecodeMetadataBuilder
from cg_run.model import DecoderModel, ForwardCtx


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    static_input_ids: torch.Tensor
    static_positions: torch.Tensor
    static_slots: torch.Tensor
    static_logits: torch.Tensor


class HandGraphRunner:
    """Small buckets: CUDA graphs captured by hand around the graph-mode wrappers."""

    def __init__(self, model: DecoderModel, backend: GraphTreeAttnBackend, builder: DecodeMetadataBuilder, cfg: ServingConfig):
        self.model = model
        self.backend = backend
        self.builder = builder
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.max_bucket = max(cfg.hand_buckets)
        self.entries: Dict[int, GraphEntry] = {}
        self.pool = None
        self.pad_positions: Optional[torch.Tensor] = None

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        for bs in sorted(self.cfg.hand_buckets, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        ids = torch.zeros(bs, dtype=torch.long, device=self.device)
        pos = torch.zeros(bs, dtype=torch.long, device=self.device)
        slots = torch.zeros(bs, dtype=torch.long, device=self.device)
        meta = self.builder.dummy(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, meta)
        ctx = ForwardCtx(bs, bs, slots, meta.block_tables, meta.seq_lens, meta.max_seq_len)
        for _ in range(2):
            self.model.forward_decode(ids, pos, ctx)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model.forward_decode(ids, pos, ctx)
        self.pool = graph.pool()
        self.entries[bs] = GraphEntry(graph, ids, pos, slots, logits)

    def replay(self, view: PaddedView) -> torch.Tensor:
        entry = self.entries[view.bucket]
        n = view.num_active
        entry.static_input_ids[:n].copy_(view.batch.input_ids)
        entry.static_slots[:n].copy_(view.batch.slot_mapping)
        if self.pad_positions is None:
            self.pad_positions = torch.zeros(self.max_bucket, dtype=torch.long, device=self.device)  # ok: FC107
        entry.static_positions = torch.cat([view.batch.positions, self.pad_positions[: view.bucket - n]])  # expect: FC107
        entry.graph.replay()
        return entry.static_logits[:n]
