"""The FP4 KV engine: scheduler-facing step, calibration on the host, graph set-up."""

from typing import List, Sequence, Tuple

import numpy as np
import torch

from fp4_attn.backend import FP4DequantBackend
from fp4_attn.metadata import DecodeBatch, FP4MetadataBuilder
from fp4kv import Calibrator, FP4Config, FP4PageCache

from .graphs import DecodeGraphRunner
from .model import FP4Decoder


class Request:
    def __init__(self, rid: int, prompt: List[int]):
        self.rid = rid
        self.tokens = list(prompt)
        self.pages_np = np.zeros(0, dtype=np.int32)
        self.sink_page = -1

    @property
    def seq_len(self) -> int:
        return len(self.tokens)


class FP4Engine:
    def __init__(self, cfg: FP4Config, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.cache = FP4PageCache(cfg.num_layers, cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                                  self.device, overflow_budget=cfg.overflow_budget, dtype=cfg.dtype)
        self.backend = FP4DequantBackend(cfg, self.cache, self.device)
        self.builder = FP4MetadataBuilder(cfg, self.cache, self.device)
        self.model = FP4Decoder(cfg, self.backend).to(self.device)
        self.runner = DecodeGraphRunner(self.model, self.backend, cfg)
        self.calibrator = Calibrator(cfg.num_layers)

    def start(self) -> None:
        self.backend.init_cuda_graph_state()
        self.runner.capture_all()

    def _make_batch(self, reqs: Sequence[Request]) -> Tuple[DecodeBatch, torch.Tensor]:
        bs = len(reqs)
        lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        table_np = np.zeros((bs, self.cfg.max_pages_per_seq), dtype=np.int32)
        slots_np = np.zeros(bs, dtype=np.int64)
        for i, r in enumerate(reqs):
            if r.seq_len > len(r.pages_np) * self.cfg.page_size:
                r.pages_np = np.concatenate([r.pages_np, self.cache.alloc(1)])
            table_np[i, : len(r.pages_np)] = r.pages_np
            slots_np[i] = int(r.pages_np[(r.seq_len - 1) // self.cfg.page_size]) * self.cfg.page_size + (
                r.seq_len - 1) % self.cfg.page_size
        batch = DecodeBatch(
            req_ids=[r.rid for r in reqs],
            input_ids=torch.tensor([r.tokens[-1] for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True),
            positions=(lens_cpu - 1).to(self.device, non_blocking=True),
            seq_lens=lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=lens_cpu,
            page_table_np=table_np,
            sink_pages_np=np.array([r.sink_page for r in reqs], dtype=np.int32),
        )
        return batch, torch.from_numpy(slots_np).to(self.device, non_blocking=True)

    def step(self, reqs: Sequence[Request]) -> torch.Tensor:
        batch, out_loc = self._make_batch(reqs)
        meta = self.builder.build(batch)
        if meta.batch_size <= self.cfg.max_graph_bs:
            return self.runner.replay(batch, meta, out_loc)
        self.backend.init_forward_metadata(meta)
        return self.model(batch.input_ids, out_loc, self.cache.global_scale, meta.batch_size)

    def calibrate(self, samples: List[Tuple[int, torch.Tensor, torch.Tensor]]) -> np.ndarray:
        """Recompute the per-layer global scales from bf16 K/V samples of a reference run."""
        for layer, k, v in samples:
            self.calibrator.observe(layer, k, v)
        scales_np = self.calibrator.global_scales()
        self.cache.upload_scales(scales_np)
        self.cache.overflow_count.zero_()
        self.calibrator.reset()
        self.backend.pending_recalibration = False
        return scales_np
