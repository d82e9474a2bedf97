"""The multi-LoRA engine: schedule, swap adapters into slots, replay or run eagerly, stream tokens."""

from __future__ import annotations

import collections
from typing import Deque, Dict, List, Optional

import torch

from loraslots.adapters import AdapterSlotTable, AdapterStore
from loraslots.config import SlotConfig
from loraslots.kvpool import PagePool
from loraslots.lora_ops import SlotLoraOps
from loraslots_rt.attention import LoraSlotAttention
from loraslots_rt.batch import Request, build_decode_batch, build_prefill_batch
from loraslots_rt.graphs import SlotGraphRunner
from loraslots_rt.model import LoraLM
from loraslots_rt.outputs import OutputQueue
from loraslots_rt.scheduler import LoraScheduler
from loraslots_rt.swapper import SlotSwapper


class LoraEngine:
    def __init__(self, cfg: SlotConfig, device: str = "cuda") -> None:
        dev = torch.device(device)
        self.cfg = cfg
        self.device = dev
        self.store = AdapterStore(cfg)
        self.table = AdapterSlotTable(cfg, dev)
        self.pool = PagePool(cfg, dev)
        self.attn = LoraSlotAttention(cfg, self.pool, dev)
        self.lora_ops = SlotLoraOps(self.table)
        self.model = LoraLM(cfg, self.attn, self.lora_ops, self.pool).to(dev).half()
        self.swapper = SlotSwapper(cfg, self.store, self.table, self.attn, dev)
        self.graphs = SlotGraphRunner(cfg, self.model, self.attn, self.table, self.lora_ops, dev)
        self.scheduler = LoraScheduler(cfg, self.pool)
        self.outputs = OutputQueue()
        self.waiting: Deque[Request] = collections.deque()
        self.running: Dict[int, Request] = {}
        self.prefix_pages: Dict[int, List[int]] = {}
        self.last_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=dev)
        self.lora_rows_total = 0

    def start(self) -> None:
        self.graphs.capture_all()
        self.outputs.start()

    def add_request(self, req: Request) -> None:
        assert req.adapter_id < 0 or req.adapter_id in self.store, "unknown adapter"  # expect: FC109
        self.waiting.append(req)

    def stats(self) -> Dict[str, object]:
        backend = self.lora_ops._backend  # ok: FC103
        return {
            "lora_backend": backend,
            "lora_rows": self.lora_rows_total,
            "swaps": self.swapper.swaps,
            "buckets": self.attn.bucket_summary(),
        }

    def _prefill(self, reqs: List[Request]) -> None:
        pb = build_prefill_batch(reqs, self.pool, self.device)
        self.attn.init_forward_metadata_prefill(pb)
        logits = self.model.forward_prefill(pb)
        first = torch.argmax(logits, dim=-1)
        self.last_ids.index_copy_(0, pb.cache_slots, first)
        self.outputs.push(pb.req_ids, first)
        for r in reqs:
            self.running[r.rid] = r

    def step(self) -> Optional[torch.Tensor]:
        plan = self.scheduler.schedule(self.waiting, self.running)
        placement = self.swapper.swap_in(plan.adapter_ids, self.running)
        for r in plan.prefill + plan.decode:
            r.slot = placement[r.adapter_id if r.adapter_id >= 0 else -1]
        if plan.prefill:
            self._prefill(plan.prefill)
        if not plan.decode:
            return None
        batch = build_decode_batch(plan.decode, self.pool, self.last_ids, self.device, self.cfg.pages_per_seq)
        self.lora_rows_total += int(batch.lora_mask_dev.sum())  # expect: FC101
        self.attn.plan_prefix(batch, self.prefix_pages, [r.adapter_id for r in plan.decode])
        if batch.size <= self.cfg.max_graph_bs:
            logits = self.graphs.replay(batch)
        else:
            self.attn.init_forward_metadata(batch)
            logits = self.model.forward_decode(
                batch.input_ids, batch.positions, batch.slot_ids, batch.out_loc, batch.size
            )
        next_ids = torch.argmax(logits, dim=-1)
        self.last_ids.index_copy_(0, batch.cache_slots, next_ids)
        self.outputs.push(batch.req_ids, next_ids)
        for i, r in enumerate(plan.decode):
            r.row = i
        return next_ids
