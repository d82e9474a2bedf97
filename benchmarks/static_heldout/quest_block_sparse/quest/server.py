"""Request bookkeeping around the Quest engine (no hot-path root here)."""

from dataclasses import dataclass, field
from typing import Dict, List

import torch

from quest.config import QuestConfig
from quest.graphs.cuda_graph_runner import CudaGraphRunner
from quest.model import QuestModel
from quest.selector import TopKPageSelector
from quest.sparse_backend import QuestAttnBackend, QuestBatch
from quest.summaries import PageSummaryCache

_INT_WS_ATTR = "_int_workspace_buffer"


@dataclass
class Request:
    rid: int
    row: int
    prompt: List[int]
    pages: List[int] = field(default_factory=list)
    graph_slot: int = -1


class QuestServer:
    def __init__(self, cfg: QuestConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.k_caches = [
            torch.zeros(cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.summaries = PageSummaryCache(cfg, device)
        self.selector = TopKPageSelector(cfg.token_budget, cfg.page_size, cfg.max_batch_size, device)
        self.backend = QuestAttnBackend(cfg, self.summaries, self.selector, self.k_caches, device)
        self.model = QuestModel(cfg, self.backend, kv_caches).to(device)
        self.runner = CudaGraphRunner(cfg, self.model, self.backend, device)
        self.requests: Dict[int, Request] = {}
        self.free_pages: List[int] = list(range(1, cfg.num_pages))

    def warmup(self) -> None:
        self.runner.capture()

    def decode(self, batch: QuestBatch, input_ids: torch.Tensor) -> torch.Tensor:
        if self.runner.can_run(batch.bs):
            return self.runner.replay(batch, input_ids)
        self.backend.init_forward_metadata(batch)
        return self.model(input_ids, batch.bs)

    def release_request(self, rid: int) -> None:
        req = self.requests.pop(rid)
        self.free_pages.extend(req.pages)
        if req.graph_slot >= 0:
            k = self.selector.k_pages
            # scrub the finished row's selection so a replay cannot reach freed pages
            self.backend.cuda_graph_kv_indices[req.graph_slot * k : (req.graph_slot + 1) * k].zero_()  # expect: FC104
        self.summaries.reset_pages(torch.tensor(req.pages, dtype=torch.int64, device=self.device))

    def stats(self) -> Dict[str, float]:
        bound_max = self.summaries.key_max.float().abs().max().item()  # ok: FC101
        return {
            "running": float(len(self.requests)),
            "free_pages": float(len(self.free_pages)),
            "summary_abs_max": bound_max,
            "bsr_int_workspace": float(getattr(self.backend.bsr_wrapper, _INT_WS_ATTR).numel()),  # expect: FC103
        }
