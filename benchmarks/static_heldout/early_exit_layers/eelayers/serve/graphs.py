"""One decode graph per (exit depth, batch size)."""

import bisect
import logging
from typing import Dict, List, Tuple

import torch

from eelayers.attn.groups import LayerGroupAttention
from eelayers.config import ExitConfig
from eelayers.model import EarlyExitModel

logger = logging.getLogger(__name__)


class ExitDepthGraphs:
    def __init__(self, cfg: ExitConfig, model: EarlyExitModel, attn: LayerGroupAttention, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.depths: List[int] = list(range(cfg.min_depth, cfg.num_groups + 1))
        self.sizes: List[int] = sorted(cfg.graph_bs)
        self.max_bs = self.sizes[-1]
        self.attn.init_graph_state(self.max_bs)
        self.static_ids = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.static_conf = torch.zeros(cfg.num_groups, self.max_bs, dtype=torch.float32, device=device)
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: Dict[Tuple[int, int], torch.Tensor] = {}
        self.pool = None

    def record_all(self) -> None:
        for depth in self.depths:
            for bs in reversed(self.sizes):
                self.record_depth(depth, bs)

    def record_depth(self, depth: int, bs: int) -> None:
        self.attn.bind_depth(depth, bs)
        _, confs = self.model.forward_to_depth(self.static_ids[:bs], depth, bs)
        peak = float(confs.max())  # expect: FC101
        if peak > self.cfg.exit_threshold:
            logger.info("depth %d bs %d: warm-up tokens already pass the exit threshold", depth, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits, confs = self.model.forward_to_depth(self.static_ids[:bs], depth, bs)
            self.static_conf[:depth, :bs].copy_(confs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[(depth, bs)] = g
        self.logits[(depth, bs)] = logits

    def replay(self, depth: int, bs: int, input_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        padded = self.sizes[bisect.bisect_left(self.sizes, bs)]
        self.static_ids[:bs].copy_(input_ids)
        self.static_conf.resize_(self.cfg.num_groups, padded)  # expect: FC107
        self.attn.stage_depth(depth, bs, padded)
        self.graphs[(depth, padded)].replay()
        return self.logits[(depth, padded)][:bs], self.static_conf[:depth, :bs]
