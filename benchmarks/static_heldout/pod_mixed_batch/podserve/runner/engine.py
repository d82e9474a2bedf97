"""The step loop: schedule, run (POD graph, eager POD, decode graph or eager decode), sample, hand off."""

from __future__ import annotations

import collections
import queue
import threading
from typing import Dict, List, Tuple

import numpy as np
import torch

from podserve.attn.pod_backend import PodAttnBackend
from podserve.config import PodConfig
from podserve.model import PodDecoder
from podserve.runner.graphs import DecodeGraphRunner, MixedGraphRunner
from podserve.scheduler import BudgetScheduler, Request, StepPlan


class KVCompactor:
    """Moves the live KV pages to the front of the pool when the free list gets short and scattered."""

    def __init__(self, backend: PodAttnBackend, scheduler: BudgetScheduler, kv_caches: List[torch.Tensor]):
        self.backend = backend
        self.scheduler = scheduler
        self.kv_caches = kv_caches
        self.min_free_frac = 0.05
        self.device = backend.device

    def maybe_compact(self, plan: StepPlan) -> bool:
        allocator = self.scheduler.allocator
        if len(allocator.free) > self.min_free_frac * allocator.num_pages:
            return False
        # only when every live page belongs to this step's decodes (no chunk in flight, nobody waiting)
        if plan.prefill is not None or len(plan.decodes) != len(self.scheduler.running):
            return False
        live_np = plan.decode_kv_indices_np
        if len(live_np) == 0:
            return False
        order = np.unique(live_np)  # ok: FC101
        remap_np = np.full(allocator.num_pages, -1, dtype=np.int32)
        remap_np[order] = np.arange(len(order), dtype=np.int32)

        src = torch.from_numpy(order.astype(np.int64)).to(self.device, non_blocking=True)
        dst = torch.arange(len(order), dtype=torch.int64, device=self.device)
        for cache in self.kv_caches:
            cache.index_copy_(0, dst, cache.index_select(0, src))

        # the decode graphs read page ids from the backend's indices: rewrite them in place
        remap = torch.from_numpy(remap_np).to(self.device, non_blocking=True)
        live = self.backend.kv_indices[: len(live_np)]
        live.copy_(remap[live.long()])  # expect: FC104

        for req in plan.decodes:
            req.pages = remap_np[np.asarray(req.pages, dtype=np.int64)].tolist()
        plan.decode_kv_indices_np = remap_np[live_np]
        allocator.free = collections.deque(range(len(order), allocator.num_pages))
        return True


class PodEngine:
    def __init__(self, cfg: PodConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.backend = PodAttnBackend(cfg, self.device)
        self.backend.init_graph_wrappers()
        kv_shape = (cfg.max_num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(kv_shape, dtype=cfg.dtype, device=self.device) for _ in range(cfg.num_layers)]
        self.model = PodDecoder(cfg, self.backend, self.kv_caches).to(self.device)
        self.scheduler = BudgetScheduler(cfg)
        self.compactor = KVCompactor(self.backend, self.scheduler, self.kv_caches)
        self.decode_graphs = DecodeGraphRunner(self.model, self.backend, cfg)
        self.mixed_graphs = MixedGraphRunner(self.model, self.backend, cfg)

        self.out_ids = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=self.device)
        self.out_ids_cpu = [torch.zeros(cfg.max_num_tokens, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self.input_ids_cpu = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, pin_memory=True)
        self.copy_stream = torch.cuda.Stream()
        self.stats: Dict[str, int] = {"steps": 0, "longest_decode": 0}
        self._lock = threading.Lock()
        self._pending: "queue.Queue[Tuple[StepPlan, torch.Tensor, torch.cuda.Event, int]]" = queue.Queue(maxsize=2)
        threading.Thread(target=self._output_loop, daemon=True).start()

    def init_graphs(self) -> None:
        self.decode_graphs.record_all()
        for chunk, bs in self.cfg.mixed_graph_shapes:
            self.mixed_graphs.record_shape(chunk, bs)

    def add_request(self, req: Request) -> None:
        with self._lock:
            self.scheduler.add_request(req)

    def _stage_inputs(self, plan: StepPlan) -> int:
        ids: List[int] = []
        if plan.prefill is not None:
            ids.extend(plan.prefill.prompt_ids[plan.chunk_start : plan.chunk_start + plan.chunk_len])
        ids.extend(r.next_token for r in plan.decodes)
        self.input_ids_cpu[: len(ids)].copy_(torch.tensor(ids, dtype=torch.int64))
        return len(ids)

    def step(self) -> int:
        with self._lock:
            plan = self.scheduler.schedule()
        if plan.num_tokens == 0:
            return 0
        self.compactor.maybe_compact(plan)
        n = self._stage_inputs(plan)
        input_ids = self.input_ids_cpu[:n].to(self.device, non_blocking=True)

        if plan.prefill is not None:
            logits = self.mixed_graphs.replay(plan, input_ids)
            if logits is None:
                meta = self.backend.prepare_mixed(plan)
                logits = self.model.forward_mixed(input_ids, self.backend.mixed_positions, meta)
                self.stats["longest_decode"] = max(self.stats["longest_decode"], meta.max_decode_len)
        elif plan.num_decodes <= self.cfg.max_graph_bs:
            positions = torch.from_numpy(plan.decode_seq_lens_np - 1).to(self.device, non_blocking=True)
            logits = self.decode_graphs.replay(plan, input_ids, positions)
        else:
            meta = self.backend.plan_eager_decode(plan)
            positions = torch.from_numpy(plan.decode_seq_lens_np - 1).to(self.device, non_blocking=True)
            logits = self.model.forward_decode(input_ids, positions, meta)

        n_out = logits.shape[0]
        off = n_out - plan.num_decodes
        next_tokens = self.out_ids[:n_out]
        next_tokens.copy_(logits.argmax(dim=-1))

        # stop scheduling decodes that just produced EOS; their pages go back when the output is committed
        finished = [r for i, r in enumerate(plan.decodes) if next_tokens[off + i] == self.cfg.eos_token_id]  # expect: FC101
        with self._lock:
            for req in finished:
                self.scheduler.running.remove(req)

        host = self.out_ids_cpu[self.stats["steps"] % 2][:n_out]
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            host.copy_(next_tokens, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        self._pending.put((plan, host, done, off))
        self.stats["steps"] += 1
        return n_out

    def _output_loop(self) -> None:
        while True:
            plan, host, done, off = self._pending.get()
            done.synchronize()  # ok: FC101
            ids = host.tolist()
            with self._lock:
                if off and plan.prefill is not None:
                    plan.prefill.output_ids.append(ids[0])
                self.scheduler.commit(plan, ids[off:])
