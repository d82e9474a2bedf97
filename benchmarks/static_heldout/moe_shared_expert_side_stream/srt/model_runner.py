"""Model runner: eager extend / decode, graph replay for decode batches, metrics export."""

from __future__ import annotations

from typing import List

import torch

from sidemoe.batch import ForwardBatch, ForwardMode, Req
from sidemoe.config import ServeConfig
from sidemoe.kv_pool import PagedKVPool
from sidemoe.metrics import ExpertLoadReporter
from sidemoe.streams import SideStreamPair
from srt.attention.flashinfer_backend import SideMoEFlashInferBackend
from srt.cuda_graph_runner import CudaGraphRunner
from srt.model import MoEModel


class ModelRunner:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.streams = SideStreamPair(device)
        self.kv_pool = PagedKVPool(cfg, device)
        self.model = MoEModel(cfg, self.streams, device).to(device)
        self.attn_backend = SideMoEFlashInferBackend(cfg, device, self.kv_pool)
        self.metrics = ExpertLoadReporter(cfg.num_layers, cfg.num_experts, device)
        self.graph_runner = CudaGraphRunner(self)
        self.graph_runner.capture()

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self.attn_backend.init_forward_metadata(fb)
        for layer in self.model.layers:
            layer.moe.prepare_step(fb)

    def _batch(self, reqs: List[Req], mode: ForwardMode) -> ForwardBatch:
        return ForwardBatch.from_reqs(reqs, mode, self.device, self.cfg.page_size, self.cfg.max_pages_per_req,
                                      self.attn_backend)

    def run_extend(self, reqs: List[Req]) -> torch.Tensor:
        fb = self._batch(reqs, ForwardMode.EXTEND)
        self.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.positions, fb)

    def run_decode(self, reqs: List[Req]) -> torch.Tensor:
        fb = self._batch(reqs, ForwardMode.DECODE)
        if fb.batch_size <= self.graph_runner.max_bs:
            logits = self.graph_runner.replay(fb)
            self.advance_graph_lengths()
            return logits
        self.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.positions, fb)

    def advance_graph_lengths(self) -> None:
        """Next step's last-page lengths, computed on the device while the host builds the next batch."""
        bs = self.attn_backend.graph_bs
        if bs is None:
            return
        lp = self.attn_backend.cuda_graph_last_page_len[:bs]
        torch.clamp(lp % self.cfg.page_size + 1, max=self.cfg.page_size, out=lp)  # expect: FC104

    def export_metrics(self) -> dict:
        for layer in self.model.layers:
            self.metrics.accumulate(layer.layer_id, layer.moe.expert_offsets)
        return self.metrics.snapshot()
