"""Decode graphs of the draft model, one per batch bucket, replayed once per draft depth."""

from dataclasses import dataclass
from typing import Dict, List

import torch

from ..config import SpecConfig
from .attn import DraftAttention
from .model import DraftModel


@dataclass
class DraftGraphEntry:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class DraftGraphRunner:
    def __init__(self, cfg: SpecConfig, model: DraftModel, attn: DraftAttention) -> None:
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.device = cfg.device
        self.static_ids = torch.zeros(cfg.max_batch_size, dtype=torch.long, device=cfg.device)
        self.static_hidden = torch.zeros(cfg.max_batch_size, cfg.hidden_size, dtype=torch.bfloat16, device=cfg.device)
        self.graphs: Dict[int, DraftGraphEntry] = {}
        self.alloc_depth_buffers()

    def alloc_depth_buffers(self) -> None:
        self.depth_tokens: List[torch.Tensor] = []
        for _ in range(self.cfg.draft_depth):
            self.depth_tokens.append(torch.zeros(self.cfg.max_batch_size, dtype=torch.long, device=self.device))

    def record_draft_bucket(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.attn.bind_bucket(bs)
        self.attn.plan_capture(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            logits = self.model(self.static_ids[:bs], self.static_hidden[:bs], bs)
        self.graphs[bs] = DraftGraphEntry(graph=g, logits=logits)

    def run_draft_bucket(self, bs: int, d: int, ids: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        entry = self.graphs.get(bs)
        if entry is None:
            logits = self.model(ids, target_hidden, bs)
        else:
            self.static_ids[:bs].copy_(ids)
            self.static_hidden[:bs].copy_(target_hidden)
            entry.graph.replay()
            logits = entry.logits[:bs]
        self.depth_tokens[d] = logits.argmax(dim=-1).clone()  # expect: FC107
        return logits
