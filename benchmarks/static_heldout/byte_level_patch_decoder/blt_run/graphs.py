"""Decode graphs, one per bucket of patches."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from blt import ByteModelConfig
from blt_attn.backend import GlobalAttentionBackend
from blt_attn.metadata import GlobalStepMeta

from .model import ByteLatentModel


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    byte_ids: torch.Tensor
    patch_index: torch.Tensor
    logits: torch.Tensor


class PatchGraphRunner:
    def __init__(self, model: ByteLatentModel, backend: GlobalAttentionBackend, cfg: ByteModelConfig,
                 device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.buckets = list(cfg.patch_buckets)
        self.graphs: Dict[int, GraphEntry] = {}
        self.plan_snapshot: Dict[int, object] = {}
        self.warmup_tokens: Dict[int, List[int]] = {}
        self.static_byte_ids = torch.zeros(cfg.max_batch, cfg.max_patch_len, dtype=torch.long, device=device)
        self.pool: Optional[tuple] = None
        self._check_buckets()

    def _check_buckets(self) -> None:
        assert self.buckets == sorted(self.buckets), "buckets must be ascending"  # ok: FC109

    def bucket_for(self, bs: int) -> Optional[int]:
        for b in self.buckets:
            if b >= bs:
                return b
        return None

    def capture_one_batch_size(self, bs: int, kv_cache: torch.Tensor) -> None:
        byte_ids = self.static_byte_ids[:bs]
        patch_index = self.backend.forward_meta.patch_index
        for _ in range(2):
            out = self.model(byte_ids, patch_index, kv_cache)
        torch.cuda.synchronize()  # ok: FC101
        self.warmup_tokens[bs] = out[:, -1].argmax(-1).tolist()  # expect: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model(byte_ids, patch_index, kv_cache)
        self.pool = g.pool()
        self.graphs[bs] = GraphEntry(graph=g, byte_ids=byte_ids, patch_index=patch_index, logits=logits)
        self.plan_snapshot[bs] = self.backend.decode_wrappers[bs]._plan_info  # expect: FC103

    def replay(self, bs: int, meta: GlobalStepMeta) -> torch.Tensor:
        entry = self.graphs[bs]
        entry.patch_index = meta.patch_index.clone()  # expect: FC107
        entry.graph.replay()
        return entry.logits

    def describe(self) -> str:
        first = self.static_byte_ids[0]
        return f"buckets={sorted(self.graphs)} first_row={first}"  # ok: FC101
