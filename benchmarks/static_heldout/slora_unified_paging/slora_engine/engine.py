"""The serving loop: hot-load adapters, build segments and the attention plan, replay the bucket."""

from collections import Counter
from typing import List

import flashcheck
import numpy as np
import torch

from slora.adapters import AdapterRegistry
from slora.config import SLoRAConfig
from slora.pool import UnifiedPagePool
from slora_engine.attention import UnifiedPagedAttention
from slora_engine.graphs import AdapterGraphBank
from slora_engine.metadata import AttnPrefillMeta, StepBatch, StepMetadataBuilder
from slora_engine.model import SLoRADecoder


class SLoRAEngine:
    def __init__(self, cfg: SLoRAConfig):
        self.cfg = cfg
        self.device = torch.device("cuda")
        self.pool = UnifiedPagePool(cfg, self.device)
        self.attn = UnifiedPagedAttention(cfg, self.pool, self.device)
        self.registry = AdapterRegistry(cfg, self.pool, self.attn, self.device)
        self.builder = StepMetadataBuilder(cfg, self.attn, self.registry, self.device)
        self.model = SLoRADecoder(cfg, self.attn, self.registry).to(self.device)
        self.graphs = AdapterGraphBank(cfg, self.model, self.attn, self.device)
        self.adapter_idx_dev = torch.zeros(cfg.max_batch, dtype=torch.int64, device=self.device)
        self.active_hist = [0] * 9
        self.recent_slots: Counter = Counter()
        self.step_no = 0

    def describe(self) -> str:
        return f"S-LoRA engine, adapters staged in {self.registry._backend} memory"  # ok: FC103

    def start(self) -> None:
        self.graphs.record_all()

    def prefill(self, prompts: List[List[int]], slots: List[int]) -> torch.Tensor:
        lens = np.array([len(p) for p in prompts], dtype=np.int32)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        pages = -(-lens // self.cfg.page_size)
        kv_cu = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        ids = np.arange(int(kv_cu[-1]), dtype=np.int32)
        last = (lens - (pages - 1) * self.cfg.page_size).astype(np.int32)
        meta = AttnPrefillMeta(
            qo_indptr=torch.from_numpy(cu).to(self.device, non_blocking=True),
            kv_indptr_host=torch.from_numpy(kv_cu),
            kv_indices=torch.from_numpy(ids).to(self.device),
            last_page_len_host=torch.from_numpy(last),
        )
        self.attn.plan_prefill(meta)
        row_slots = torch.from_numpy(np.repeat(np.asarray(slots, dtype=np.int64), lens)).pin_memory()
        lora_meta = self.builder.build_prefill(row_slots)
        input_ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=self.device)
        return self.model.forward_prefill(input_ids, lora_meta)

    @flashcheck.hot_path
    def step(self, batch: StepBatch) -> torch.Tensor:
        self.step_no += 1
        bs = batch.bs
        self.adapter_idx_dev[:bs].copy_(batch.adapter_slots_host[:bs], non_blocking=True)
        active = torch.unique(self.adapter_idx_dev[:bs])  # expect: FC101
        self.active_hist[min(active.numel(), len(self.active_hist) - 1)] += 1
        self.recent_slots.update(batch.adapter_slots_host[:bs].numpy().tolist())  # ok: FC101
        self.registry.ensure_loaded(batch.adapter_ids, self.step_no)
        meta = self.builder.build(batch)
        return self.graphs.replay(bs, batch.input_ids, meta)
