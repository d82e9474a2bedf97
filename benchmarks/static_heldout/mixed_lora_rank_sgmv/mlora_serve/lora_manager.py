"""Adapter swapping between steps and SGMV segment building every step."""
import logging
import queue
import threading
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
import torch

from mlora.adapters import AdapterSlotTable, AdapterSpec
from mlora.segments import SegmentInfo, group_by_adapter

if TYPE_CHECKING:
    from mlora_serve.attention import LoraAttnBackend
    from mlora_serve.scheduler import ScheduledBatch

logger = logging.getLogger(__name__)


class AdapterLoader:
    """Reads adapter weights on a background thread and stages them on the device through a side stream."""

    def __init__(self, registry: Dict[str, Tuple[AdapterSpec, str]], device: torch.device):
        self.registry = registry
        self.device = device
        self.copy_stream = torch.cuda.Stream(device=device)
        self.requests: "queue.Queue[str]" = queue.Queue()
        self.ready: Dict[str, Tuple[AdapterSpec, torch.Tensor, torch.Tensor]] = {}
        self.inflight: set = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lora-loader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def begin_step(self, batch: "ScheduledBatch") -> None:
        for name in batch.adapter_names:
            if name not in self.ready and name not in self.inflight:
                self.inflight.add(name)
                self.requests.put(name)

    def take(self, name: str) -> Optional[Tuple[AdapterSpec, torch.Tensor, torch.Tensor]]:
        with self._lock:
            staged = self.ready.pop(name, None)
        if staged is not None:
            self.inflight.discard(name)
        return staged

    def _run(self) -> None:
        while True:
            name = self.requests.get()
            spec, path = self.registry[name]
            blob = torch.load(path, map_location="cpu")
            with torch.cuda.stream(self.copy_stream):
                a = blob["lora_a"].pin_memory().to(self.device, non_blocking=True)
                b = blob["lora_b"].pin_memory().to(self.device, non_blocking=True)
            self.copy_stream.synchronize()  # ok: FC101
            with self._lock:
                self.ready[name] = (spec, a, b)


class LoraManager:
    def __init__(self, slots: AdapterSlotTable, attn: "LoraAttnBackend", loader: AdapterLoader, max_bs: int, device: torch.device):
        self.slots = slots
        self.attn = attn
        self.loader = loader
        self.device = device
        # SGMV inputs the decode graphs read; written in place for graph batches
        self.graph_seg_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_weight_indices = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.graph_token_slots = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.seg_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.weight_indices_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        # borrow FlashInfer's float workspace as SGMV split-k scratch instead of allocating a second one
        self.sgmv_scratch = attn.eager_decode._float_workspace_buffer  # expect: FC103
        self.requests_by_adapter: Dict[str, List[int]] = {}
        self.current: Optional[SegmentInfo] = None

    def track(self, rid: int, adapter: str) -> None:
        self.requests_by_adapter.setdefault(adapter, []).append(rid)

    def begin_step(self, batch: "ScheduledBatch") -> None:
        preempted = self.swap_adapters(batch.adapter_names)
        if preempted:
            logger.info("preempted %d requests whose adapters were evicted", len(preempted))

    def swap_adapters(self, wanted: List[str]) -> List[int]:
        preempted: List[int] = []
        for name in wanted:
            if name in self.slots.name_to_slot:
                continue
            staged = self.loader.take(name)
            if staged is None:
                continue
            spec, weights_a, weights_b = staged
            slot = self.slots.pick_victim()
            evicted = self.slots.slot_names[slot]
            if evicted is not None:
                preempted.extend(self._drop_requests_of(evicted))
            self.slots.load(spec, slot, weights_a, weights_b)
        return preempted

    def _drop_requests_of(self, name: str) -> List[int]:
        rids = self.requests_by_adapter.pop(name, [])
        for rid in rids:
            start, end = self.attn.page_span(rid)
            # the evicted request keeps its rows until the scheduler repacks: point them at the scratch page
            self.attn.kv_indices[start:end].zero_()  # expect: FC104
        return rids

    def prepare_step(self, slot_ids_np: np.ndarray, tokens_per_req_np: np.ndarray, graph_bs: Optional[int], debug: bool = False) -> SegmentInfo:
        self.slots.touch(slot_ids_np)
        _, seg_slots_np, seg_lens_np = group_by_adapter(slot_ids_np, tokens_per_req_np)
        nseg = int(seg_slots_np.size)
        num_tokens = int(tokens_per_req_np.sum())
        max_rank = int(self.slots.slot_ranks_cpu[seg_slots_np].max()) if nseg else 0  # ok: FC101
        seg_lens_cpu = torch.from_numpy(seg_lens_np)
        if graph_bs is not None:
            self.seg_indptr_cpu[0] = 0
            torch.cumsum(seg_lens_cpu, 0, out=self.seg_indptr_cpu[1 : nseg + 1])
            self.seg_indptr_cpu[nseg + 1 :] = num_tokens
            self.weight_indices_cpu[:nseg] = torch.from_numpy(seg_slots_np)
            self.weight_indices_cpu[nseg:] = 0
            self.graph_seg_indptr.copy_(self.seg_indptr_cpu, non_blocking=True)
            self.graph_weight_indices.copy_(self.weight_indices_cpu, non_blocking=True)
            seg_lens_dev = seg_lens_cpu.to(self.device, non_blocking=True)
            self.graph_token_slots[:num_tokens].copy_(torch.repeat_interleave(self.graph_weight_indices[:nseg], seg_lens_dev, output_size=num_tokens))  # ok: FC101
            info = SegmentInfo(self.graph_seg_indptr, self.graph_weight_indices, seg_lens_cpu, max_rank, num_tokens, self.graph_token_slots[:num_tokens])
        else:
            seg_indptr = torch.zeros(nseg + 1, dtype=torch.int32, device=self.device)
            seg_indptr[1:] = torch.cumsum(seg_lens_cpu, 0).to(self.device, non_blocking=True)
            weight_indices = torch.from_numpy(seg_slots_np).to(self.device, non_blocking=True)
            info = SegmentInfo(seg_indptr, weight_indices, seg_lens_cpu, max_rank, num_tokens)
            seg_lens_dev = seg_lens_cpu.to(self.device, non_blocking=True)
            info.token_slots = torch.repeat_interleave(info.weight_indices, seg_lens_dev)  # expect: FC101
        if debug:
            print(f"lora segments: indptr={info.seg_indptr} slots={info.weight_indices}")  # ok: FC101
        self.current = info
        return info

    def init_graph_segments(self, bs: int, rank_bucket: int) -> SegmentInfo:
        # capture with every row on the base slot, one segment per row
        self.graph_seg_indptr.copy_(torch.arange(self.graph_seg_indptr.numel(), dtype=torch.int32).clamp_(max=bs), non_blocking=True)
        self.graph_weight_indices.zero_()
        self.graph_token_slots.zero_()
        return SegmentInfo(self.graph_seg_indptr, self.graph_weight_indices, torch.ones(bs, dtype=torch.int32), rank_bucket, bs, self.graph_token_slots[:bs])
