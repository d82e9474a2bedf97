"""One decode graph per batch size; selection and plans run before each replay."""

import bisect
import logging
from typing import Dict, List

import torch

from quest.config import QuestConfig
from quest.model import QuestModel
from quest.sparse_backend import QuestAttnBackend, QuestBatch

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, cfg: QuestConfig, model: QuestModel, backend: QuestAttnBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        self.capture_bs: List[int] = sorted(cfg.graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.backend.init_cuda_graph_state(self.max_bs)
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101
        logger.info("captured %d quest decode graphs", len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        out = self.model(self.input_ids[:bs], bs)
        if torch.isnan(out).any():  # expect: FC101
            raise RuntimeError(f"warm-up decode for bs={bs} produced NaN logits")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model(self.input_ids[:bs], bs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def page_capacity(self, bs: int) -> int:
        w = self.backend.graph_sparse_decode[bs]
        return w._paged_kv_indices_buf.numel()  # expect: FC103

    def can_run(self, bs: int) -> bool:
        return bs <= self.max_bs

    def replay(self, batch: QuestBatch, input_ids: torch.Tensor) -> torch.Tensor:
        bs = batch.bs
        padded = self.capture_bs[bisect.bisect_left(self.capture_bs, bs)]
        self.input_ids[:bs].copy_(input_ids)
        self.backend.init_forward_metadata_replay_cuda_graph(batch, padded)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
