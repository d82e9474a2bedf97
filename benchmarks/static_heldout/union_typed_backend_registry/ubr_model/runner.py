"""The model runner: builds the backend from its config string and drives each step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from ubr import ModelConfig, StepBatch, build_step_batch
from ubr_backends.registry import create_backend
from ubr_model.graph_runner import CudaGraphRunner
from ubr_model.model import DecoderModel


@dataclass
class Request:
    rid: int
    slot: int
    last_token: int
    seq_len: int
    pages: List[int] = field(default_factory=list)


class ModelRunner:
    def __init__(self, cfg: ModelConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.backend = create_backend(cfg.backend, cfg, device)
        self.model = DecoderModel(cfg, self.backend).to(device)
        kv_shape = (cfg.num_kv_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(kv_shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.graph_runner = CudaGraphRunner(self.model, self.backend, self.kv_caches, cfg.capture_buckets, device)
        self.page_table_np = np.zeros((cfg.max_batch, cfg.max_pages_per_seq), dtype=np.int32)
        self.row_offsets_np = np.zeros(cfg.max_batch + 1, dtype=np.int64)

    def prepare_batch(self, reqs: List[Request]) -> StepBatch:
        input_ids_np = np.array([r.last_token for r in reqs], dtype=np.int64)
        seq_lens_np = np.array([r.seq_len for r in reqs], dtype=np.int32)
        for i, r in enumerate(reqs):
            self.page_table_np[i, : len(r.pages)] = r.pages
        return build_step_batch(input_ids_np, seq_lens_np, self.page_table_np, self.cfg.page_size, self.device)

    def step(self, reqs: List[Request]) -> torch.Tensor:
        batch = self.prepare_batch(reqs)
        if batch.batch_size <= self.graph_runner.max_bs:
            logits = self.graph_runner.replay(batch)
        else:
            self.backend.init_forward_metadata(batch)
            valid = torch.ones(batch.batch_size, dtype=torch.bool, device=self.device)
            logits = self.model.forward_decode(batch.input_ids, batch.positions, self.kv_caches, valid)
        return logits.argmax(dim=-1)

    def free_request(self, row: int, num_pages: int) -> None:
        start = int(self.row_offsets_np[row])
        self.backend.scrub_pages(start, start + num_pages)
