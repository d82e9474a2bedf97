"""CUDA graphs of the local/global decode step, one per batch-size bucket."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from ringserve.attn.base import ForwardBatch
from ringserve.attn.flashinfer_ring import FlashInferRingBackend
from ringserve.config import RingConfig
from ringserve.ring.ring_cache import RingKVCache
from ringserve.runtime.model import SlidingWindowLM

class RingGraphRunner:
    def __init__(self, model: SlidingWindowLM, backend: FlashInferRingBackend, cache: RingKVCache, cfg: RingConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cache = cache
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_graph_bs
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.graph_stream = torch.cuda.Stream(device)

    def _run_decode(self, bs: int) -> torch.Tensor:
        return self.model.forward_decode(
            self.static_input_ids[:bs], self.static_positions[:bs], self.static_out_loc[:bs]
        )

    @torch.inference_mode()
    def capture_all(self) -> None:
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        # dummy slots: row i reads a one-page ring of slot i
        slots_np = np.arange(bs, dtype=np.int64)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, slots_np)
        for _ in range(2):
            self._run_decode(bs)
        torch.cuda.synchronize()  # ok: FC101
        max_seq = self.static_seq_lens[:bs].max().item()  # expect: FC101
        self.backend.captured_max_seq[bs] = max_seq
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.graph_stream):
            out = self._run_decode(bs)
        self.pool = self.pool or g.pool()
        self.graphs[bs] = g
        self.static_logits[bs] = out

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        raw_bs = batch.batch_size
        bs = self.backend.padded_bs(raw_bs)
        self.static_input_ids[:raw_bs].copy_(batch.input_ids_gpu, non_blocking=True)
        self.static_positions[:raw_bs].copy_(batch.positions_gpu, non_blocking=True)
        self.static_out_loc[:raw_bs].copy_(batch.out_loc_gpu, non_blocking=True)
        self.static_seq_lens = batch.seq_lens_gpu.clone()  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, batch.slots_np, batch.crossed_page)
        self.graphs[bs].replay()
        return self.static_logits[bs][:raw_bs]
