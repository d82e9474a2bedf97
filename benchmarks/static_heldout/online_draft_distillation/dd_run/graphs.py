"""Draft decode graphs (re-captured after every weight update) and target verify graphs."""
from typing import Dict, List, Optional, Tuple

import torch

from dd_attn.attention import DraftAttention, TargetAttention
from dd_attn.layout import SpecBatch
from distill import DistillConfig

from .models import DraftLM, TargetLM


class DraftGraphs:
    def __init__(self, model: DraftLM, attn: DraftAttention, cfg: DistillConfig, device: torch.device):
        self.model, self.attn, self.cfg, self.device = model, attn, cfg, device
        self.k = cfg.num_draft_tokens
        self.static_ids = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.draft_out = torch.zeros(cfg.max_bucket, self.k, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None
        self._use_cuda_graph = True  # ok: FC103

    def capture_all(self, kv_caches: List[torch.Tensor]) -> None:
        if not self._use_cuda_graph:
            return
        # plans made for the previous graphs must not leak into the new capture
        for _, w in self.attn.graph_wrappers.items():
            w._plan_info = None  # expect: FC103
        for bs in sorted(self.cfg.draft_buckets, reverse=True):
            self.capture_bucket(bs, kv_caches)
        torch.cuda.synchronize()  # ok: FC101

    def capture_bucket(self, bs: int, kv_caches: List[torch.Tensor]) -> None:
        self.attn.plan_bucket(bs, SpecBatch.dummy(bs, self.device), 0)
        self.model.decode(self.static_ids[:bs], kv_caches, bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[bs] = self.model.decode(self.static_ids[:bs], kv_caches, bs)
        self.pool = self.pool or graph.pool()
        self.graphs[bs] = graph

    def replay_draft(self, bs: int, batch: SpecBatch) -> torch.Tensor:
        n = batch.num_rows
        self.static_ids[:n].copy_(batch.last_tokens)
        for j in range(self.k):
            self.attn.plan_bucket(bs, batch, j)
            self.graphs[bs].replay()
            torch.argmax(self.logits[bs][:n], dim=-1, out=self.static_ids[:n])
            self.draft_out[:n, j].copy_(self.static_ids[:n])
        return self.draft_out[:n]


class TargetGraphs:
    def __init__(self, model: TargetLM, attn: TargetAttention, cfg: DistillConfig, device: torch.device):
        self.model, self.attn, self.device = model, attn, device
        self.static_last = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.static_draft_tokens = torch.zeros(cfg.max_bucket, cfg.num_draft_tokens, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def capture_verify(self, bs: int, kv_caches: List[torch.Tensor]) -> None:
        self.attn.plan_verify(bs, SpecBatch.dummy(bs, self.device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs[bs] = self.model.verify(self.static_last[:bs], self.static_draft_tokens[:bs], kv_caches, bs)
        self.graphs[bs] = graph

    def replay(self, bs: int, batch: SpecBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        n = batch.num_rows
        self.static_last[:n].copy_(batch.last_tokens)
        self.attn.plan_verify(bs, batch)
        self.graphs[bs].replay()
        logits, hidden = self.outputs[bs]
        return logits[:n], hidden[:n]
