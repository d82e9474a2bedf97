from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class PrefetchPlan:
    layer: int = -1
    experts: Tuple[int, ...] = ()
    step: int = -1


class ExpertPrefetcher:
    """Predicts the next layer's experts from this layer's hidden state and loads them on a side stream."""

    def __init__(self, cfg, cache, device):
        self.cfg = cfg
        self.cache = cache
        self.device = device
        self.predictor = torch.zeros((cfg.num_layers, cfg.hidden, cfg.num_experts), dtype=torch.bfloat16, device=device)
        self.pred_ids_pinned = torch.zeros((cfg.num_layers, 2 * cfg.top_k), dtype=torch.int64, pin_memory=True)
        self.side = torch.cuda.Stream(device=device)
        self.copy_done = torch.cuda.Event()
        self.route_bias = None
        self._plan_info = PrefetchPlan()  # ok: FC103
        self.step_no = 0

    def prefetch_next(self, layer, hidden):
        nxt = layer + 1
        if nxt >= self.cfg.num_layers:
            self.step_no += 1
            return
        pooled = hidden.float().mean(dim=0)
        probs = torch.softmax(pooled @ self.predictor[nxt].float(), dim=-1)
        scores, ids = probs.topk(2 * self.cfg.top_k)
        if not (scores > self.cfg.prefetch_threshold).any():  # expect: FC101
            return
        if self.route_bias is None:
            self.route_bias = torch.zeros((self.cfg.num_layers, self.cfg.num_experts), device=self.device)  # ok: FC107
        self.route_bias[nxt].mul_(0.9).index_add_(0, ids, scores)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            self.pred_ids_pinned[nxt].copy_(ids, non_blocking=True)
            self.copy_done.record(self.side)
        upcoming = self.pred_ids_pinned[nxt].tolist()  # expect: FC101
        self._plan_info = PrefetchPlan(nxt, tuple(upcoming), self.step_no)
        self.cache.prefetch(nxt, upcoming)
