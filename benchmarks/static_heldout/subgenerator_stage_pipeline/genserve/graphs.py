"""Per-bucket CUDA graphs of the decode forward."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch

from .attention import AttentionBackend
from .batch import StepMeta
from .buffers import BufferSet, StepBuffers
from .config import EngineConfig
from .model import TinyDecoder


class GraphRunner:
    def __init__(self, cfg: EngineConfig, model: TinyDecoder, backend: AttentionBackend, bufs: StepBuffers) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.bufs = bufs
        self.device = torch.device(cfg.device)
        max_bs = max(cfg.decode_buckets)
        self.static_inputs = BufferSet[torch.int64](
            input_ids=torch.zeros(max_bs, dtype=torch.int64, device=self.device),
        )
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def capture_all(self) -> None:
        for bs, w in sorted(self.backend.graph_wrappers.items(), reverse=True):
            if not getattr(w, "_use_cuda_graph", False):  # expect: FC103
                raise RuntimeError(f"bucket {bs}: decode wrapper is not in CUDA-graph mode")
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        meta = self.backend.prepare_dummy_batch(bs)
        ids = self.static_inputs["input_ids"][:bs]
        pos = self.bufs.positions[:bs]
        for _ in range(2):
            self.model.decode_forward(ids, pos, meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            meta = dataclasses.replace(meta, max_len=int(meta.seq_lens.max()))  # expect: FC101
            logits = self.model.decode_forward(ids, pos, meta)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.static_logits[bs] = logits

    def replay(self, bs: int, meta: StepMeta) -> torch.Tensor:
        bucket = meta.bucket if meta.bucket is not None else self.cfg.bucket_for(bs)
        # the metadata stage recycles its upload buffer for the next step: keep our own copy of the ids
        self.static_inputs["input_ids"] = meta.input_ids.clone()  # expect: FC107
        self.graphs[bucket].replay()
        return self.static_logits[bucket][:bs]
