"""The serving loop: admit prompts, build one ForwardBatch per step, replay or run eagerly, sample."""
from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np
import torch

import flashcheck
from mtm.config import EngineConfig
from mtm.kvcache import ForwardBatch, MLAKVPool, append_decode_slots_
from mtm.parallel.tp import TPGroup
from mtm_engine.backends import make_backend
from mtm_engine.graph_runner import CudaGraphRunner
from mtm_engine.model import DeepseekModel


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    req_idx: int = -1
    output_ids: List[int] = field(default_factory=list)
    slots: List[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class MLAEngine:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg, self.device, self.tp = cfg, device, TPGroup.from_env()
        self.kv_pool = MLAKVPool(cfg, device)
        self.backend = make_backend(cfg, device, self.kv_pool)
        self.model = DeepseekModel(cfg, self.backend, self.kv_pool, self.tp).to(device)
        for layer in self.model.layers:
            layer.mlp.init_workspace(device)
        self.graph_runner = CudaGraphRunner(self.model, self.backend, cfg, device, self.tp)
        self.waiting: Deque[Request] = collections.deque()
        self.running: List[Request] = []
        self.next_ids_cpu: Optional[torch.Tensor] = None
        self.step_done = torch.cuda.Event()
        self.last_batch: List[Request] = []
        self.to_device = functools.partial(torch.Tensor.to, device=device, non_blocking=True)

    def load_weights(self, state: Dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state, strict=False)
        self.model.post_load_weights()
        self.graph_runner.capture()

    def add_request(self, rid: int, prompt_ids: List[int], max_new_tokens: int) -> None:
        if len(prompt_ids) + max_new_tokens > self.cfg.max_context_len:
            raise ValueError(f"request {rid}: {len(prompt_ids)} + {max_new_tokens} tokens > {self.cfg.max_context_len}")
        self.waiting.append(Request(rid, list(prompt_ids), max_new_tokens))

    def _schedule(self) -> Tuple[str, List[Request]]:
        if self.waiting and len(self.running) < self.cfg.max_running_requests:
            batch, budget = [], self.cfg.max_num_tokens
            while self.waiting and budget >= len(self.waiting[0].prompt_ids) and self.kv_pool.free_reqs:
                r = self.waiting.popleft()
                r.req_idx = self.kv_pool.free_reqs.pop()
                budget -= len(r.prompt_ids)
                batch.append(r)
            if batch:
                return "extend", batch
        return "decode", self.running

    def _build_batch(self, mode: str, reqs: List[Request]) -> ForwardBatch:
        ids, pos, rows, new_lens = [], [], [], []
        for r in reqs:
            toks = r.prompt_ids if mode == "extend" else r.output_ids[-1:]
            start = r.seq_len - len(toks)
            ids += toks
            pos += range(start, start + len(toks))
            rows += [r.req_idx] * len(toks)
            new_lens.append(len(toks))
        slots = self.kv_pool.alloc_slots(len(ids))
        slots_dev = self.to_device(torch.from_numpy(slots))
        pos_cpu = torch.tensor(pos, dtype=torch.int64)
        self.kv_pool.req_to_token[self.to_device(torch.tensor(rows)), self.to_device(pos_cpu)] = slots_dev.int()
        for r, part in zip(reqs, np.split(slots, np.cumsum(new_lens)[:-1])):
            r.slots.extend(part.tolist())
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        return ForwardBatch(
            mode=mode,
            input_ids=self.to_device(torch.tensor(ids, dtype=torch.int64)),
            positions=self.to_device(pos_cpu),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            req_pool_indices=torch.tensor([r.req_idx for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True),
            out_cache_loc=slots_dev,
            extend_lens_cpu=torch.tensor(new_lens, dtype=torch.int32) if mode == "extend" else None,
        )

    @flashcheck.hot_path
    @torch.inference_mode()
    def step(self) -> int:
        mode, reqs = self._schedule()
        if not reqs:
            return 0
        fb = self._build_batch(mode, reqs)
        if fb.is_decode and fb.batch_size <= self.graph_runner.bs_list[-1]:
            logits = self.graph_runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            logits = self.model(fb)
        next_ids = torch.argmax(logits, dim=-1)
        if fb.is_decode and self.cfg.reuse_decode_metadata:
            # keep the packed decode indices current so the next step can skip the gather kernel
            bs = fb.batch_size
            row_ends = (self.backend.kv_indptr_cpu[1 : bs + 1] + torch.arange(bs, dtype=torch.int32)).to(self.device, non_blocking=True)
            append_decode_slots_(self.backend.kv_indices, row_ends, fb.out_cache_loc)  # expect: FC104
        self.next_ids_cpu = torch.empty(fb.batch_size, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.next_ids_cpu.copy_(next_ids, non_blocking=True)
        self.step_done.record()
        if mode == "extend":
            self.running.extend(reqs)
        self.last_batch = reqs
        return len(reqs)

    def process_outputs(self) -> List[Request]:
        """Runs after the step on the scheduler thread; the only place the sampled ids reach the host."""
        self.step_done.synchronize()
        for r, t in zip(self.last_batch, self.next_ids_cpu.tolist()):
            r.output_ids.append(t)
        finished = [r for r in self.running if len(r.output_ids) >= r.max_new_tokens]
        for r in finished:
            self.kv_pool.free(np.asarray(r.slots, dtype=np.int64))
            self.kv_pool.free_reqs.append(r.req_idx)
            self.running.remove(r)
        return finished
