"""The engine: admissions through the paged prefill, decode through the KV-aware batcher."""

import logging
import types
from typing import List

import flashcheck
import numpy as np
import torch

from kb_attn.backend import BatcherBackend, describe_wrapper
from kb_attn.meta import FlashInferBuilder
from kb_attn.records import make_admission
from kb_run.graphs import DecodeGraphs
from kb_run.model import BatchedLM
from kvbatch import BatcherConfig, LinearCostModel
from kvbatch.batcher import KVAwareBatcher
from kvbatch.metrics import MetricsHook

logger = logging.getLogger(__name__)


class BatcherEngine:
    def __init__(self, cfg: BatcherConfig):
        self.cfg = cfg
        self.device = cfg.device
        self.backend = BatcherBackend(cfg)
        self.backend.init_graph_wrappers()
        self.model = BatchedLM(cfg, self.backend).to(self.device)
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
            dtype=torch.bfloat16, device=self.device,
        )
        self.builder = FlashInferBuilder(cfg, self.backend)
        self.cost_model = LinearCostModel(per_token_us=0.002, per_row_us=1.5, fixed_us=40.0)
        self.batcher = KVAwareBatcher(cfg, self.cost_model, self.backend, cfg.decode_buckets)
        self.graphs = DecodeGraphs(self.model, self.backend, self.builder, self.kv_cache, cfg)
        self.metrics = MetricsHook(cfg.page_budget)
        self.describe_cascade = types.MethodType(describe_wrapper, self.backend.cascade)
        self.step_idx = 0

    def start(self) -> None:
        self.graphs.capture_all()
        if not self.backend.jit_ready():
            logger.warning("decode wrappers captured before their JIT modules were loaded")

    def admit(self, slots: List[int], prompts: List[np.ndarray], tables: List[np.ndarray], slot_mapping: np.ndarray) -> torch.Tensor:
        adm = make_admission(prompts, tables, self.cfg.page_size, self.device)
        self.backend.plan_admission(adm)
        for slot, pages, prompt in zip(slots, tables, prompts):
            self.builder.set_table(slot, pages, len(prompt))
        self.batcher.commit(slots, np.array([len(p) for p in prompts], dtype=np.int64))
        kv_slots = torch.from_numpy(slot_mapping).to(self.device, non_blocking=True)
        return self.model.forward_prefill(adm.input_ids, adm.positions, self.kv_cache, kv_slots, adm.last_rows)

    @flashcheck.hot_path
    def step(
        self,
        ready: List[int],
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        step_budget_us: float,
    ) -> torch.Tensor:
        batch = self.batcher.form_batch(ready, step_budget_us)
        rows = np.asarray(batch.slots, dtype=np.int64)
        ids = torch.from_numpy(input_ids[rows]).to(self.device, non_blocking=True)
        pos = torch.from_numpy(positions[rows]).to(self.device, non_blocking=True)
        kv_slots = torch.from_numpy(slot_mapping[rows]).to(self.device, non_blocking=True)
        logits = self.graphs.replay(batch, ids, pos, kv_slots)
        self.metrics.on_step(self.step_idx, batch)
        self.step_idx += 1
        return logits

    def status(self) -> dict:
        return {
            "cascade": self.describe_cascade(),
            "layout": self.batcher.layout(),
            "metrics": self.metrics.summary(),
        }
