"""The multi-LoRA engine step: swap adapters in, build SGMV segments, plan attention, run a graph or eagerly."""
from typing import Dict, List, Optional, Protocol, Tuple

import numpy as np
import torch

from mlora.adapters import AdapterSlotTable, AdapterSpec
from mlora.config import EngineConfig
from mlora_serve.attention import LoraAttnBackend
from mlora_serve.graph_runner import LoraGraphRunner
from mlora_serve.lora_manager import AdapterLoader, LoraManager
from mlora_serve.model import LoraLlama
from mlora_serve.scheduler import AdapterAwareScheduler, ScheduledBatch


class Scheduler(Protocol):
    def schedule(self) -> Optional[ScheduledBatch]: ...


class LoraEngine:
    def __init__(self, cfg: EngineConfig, registry: Dict[str, Tuple[AdapterSpec, str]], scheduler: Scheduler, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.scheduler = scheduler
        self.slots = AdapterSlotTable(cfg.max_loras, cfg.hidden_size, cfg.num_layers, cfg.initial_max_rank, device)
        self.attn = LoraAttnBackend(cfg, device)
        self.loader = AdapterLoader(registry, device)
        self.manager = LoraManager(self.slots, self.attn, self.loader, cfg.max_decode_bs, device)
        self.model = LoraLlama(cfg, self.slots, self.attn).to(device)
        self.graphs = LoraGraphRunner(cfg, self.model, self.attn, self.manager, device)

    @classmethod
    def build(cls, cfg: EngineConfig, registry: Dict[str, Tuple[AdapterSpec, str]], device: torch.device) -> "LoraEngine":
        free_pages = list(range(cfg.max_pages - 1, 0, -1))
        return cls(cfg, registry, AdapterAwareScheduler(cfg, free_pages, device), device)

    def warmup(self) -> None:
        self.loader.start()
        self.graphs.capture_all()

    def step(self) -> Optional[torch.Tensor]:
        batch: Optional[ScheduledBatch] = self.scheduler.schedule()
        if batch is None:
            return None
        for hook in (self.loader, self.manager):
            hook.begin_step(batch)
        slot_ids_np = np.array([self.slots.name_to_slot.get(name, 0) for name in batch.adapter_per_req], dtype=np.int32)
        if batch.is_prefill:
            self.attn.graph_bs = None
            info = self.manager.prepare_step(slot_ids_np, batch.tokens_per_req_np, None, debug=False)
            self.attn.plan_prefill(batch.qo_indptr_host, batch.kv_indptr_host, batch.page_ids_host, batch.last_len_host, batch.block_table_host, batch.max_q, batch.max_kv)
            logits = self.model.prefill(batch.input_ids, batch.positions, info)
        else:
            bs = len(batch.rids)
            bucket = self.graphs.bucket_for(bs)
            slot_ids_dev = torch.from_numpy(slot_ids_np).to(self.device, non_blocking=True)
            rank_bucket = self.graphs.rank_bucket_for(int(self.slots.slot_ranks[slot_ids_dev].max()))  # expect: FC101
            info = self.manager.prepare_step(slot_ids_np, batch.tokens_per_req_np, bucket, debug=False)
            self.attn.graph_bs = bucket
            self.attn.refresh_decode(bs, batch.rids, batch.page_ids_host, batch.pages_per_req_host, batch.last_len_host, batch.block_table_host, batch.vtok_counts_host, batch.vtok_slots_host)
            if bucket is not None:
                logits = self.graphs.replay(bucket, rank_bucket, batch.input_ids, batch.positions)
            else:
                logits = self.model(batch.input_ids, batch.positions, info)
        return torch.argmax(logits, dim=-1)
