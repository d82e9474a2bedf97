"""Decode CUDA graphs per batch bucket over the graph-mode cascade wrappers."""

import logging
from typing import TYPE_CHECKING, Dict

import numpy as np
import torch

from docqa.config import QAConfig
from docqa_srv.backend import DocQABackend
from docqa_srv.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from docqa_srv.server import DocQAModel

logger = logging.getLogger(__name__)


class DocGraphRunner:
    def __init__(self, cfg: QAConfig, model: "DocQAModel", backend: DocQABackend, device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        self._use_cuda_graph = not cfg.disable_cuda_graph
        max_bs = cfg.max_batch_size
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.doc_ids = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.outputs: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.layouts: Dict[int, str] = {}

    def _dummy_batch(self, bs: int, doc_groups: np.ndarray) -> ForwardBatch:
        ones = np.ones(bs, dtype=np.int64)
        pages = [np.array([i], dtype=np.int32) for i in range(bs)]
        return ForwardBatch(list(range(bs)), doc_groups, ones, ones, pages, self.input_ids[:bs],
                            self.cfg.page_size, self.device, is_decode=True)

    def capture_one_batch_size(self, bs: int) -> None:
        doc_groups = self.doc_ids[:bs].cpu().numpy()  # expect: FC101
        fb = self._dummy_batch(bs, doc_groups)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        for _ in range(2):
            self.model.forward_decode(self.input_ids[:bs], fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.outputs[bs] = self.model.forward_decode(self.input_ids[:bs], fb)
        self.graphs[bs] = g
        self.layouts[bs] = self.backend.graph_cascade[bs]._kv_layout  # expect: FC103

    def capture(self) -> None:
        if not self._use_cuda_graph:  # ok: FC103
            return
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.capture_one_batch_size(bs)
        self.backend.graph_bs = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return self._use_cuda_graph and fb.is_decode and fb.batch_size <= self.cfg.graph_batch_sizes[-1]

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw = fb.batch_size
        bs = next(b for b in self.cfg.graph_batch_sizes if b >= raw)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.input_ids[:raw].copy_(fb.input_ids)
        self.graphs[bs].replay()
        self.backend.graph_bs = None
        return self.outputs[bs][:raw]
