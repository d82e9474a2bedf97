"""Elastic-TP engine: a decode step at the current degree, and rescaling between degrees."""
from __future__ import annotations

import threading
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

import flashcheck
from elastictp.comm.group import TPGroupRegistry
from elastictp.comm.reshard import reshard_kv_heads
from elastictp.kv import HostPages, ShardedKVCache
from elastictp.limits import EngineLimits, zeroed_workspace
from elastictp.topology import ModelDims, TPLayout, layout_for
from etp_runtime.attn_state import TPAttnState
from etp_runtime.batch import Seq, StepBatch
from etp_runtime.controller import RescaleController
from etp_runtime.graphs import TPGraphSet
from etp_runtime.model import AttnRouter, ElasticLM


class ElasticEngine:
    def __init__(self, dims: ModelDims, limits: EngineLimits, initial_tp: int = 2, device: str = "cuda") -> None:
        self.dims = dims
        self.limits = limits
        self.device = torch.device(device)
        self.groups = TPGroupRegistry(limits.supported_tp)
        self.initial_tp = initial_tp
        self.tp_cpu = torch.tensor([initial_tp], dtype=torch.int32)
        self.layout: TPLayout = layout_for(dims, initial_tp, self.groups.rank)
        self.kv = ShardedKVCache(dims, limits, self.layout, self.device)
        self.pages = HostPages(limits, max_rows=4 * limits.max_batch)
        top_heads = dims.num_q_heads // min(limits.supported_tp)
        self.shared_trt_ws = zeroed_workspace(limits.trtllm_ws_bytes(top_heads, dims.head_dim), self.device)
        self.states: Dict[int, TPAttnState] = {}
        state = self._build_state(self.layout, self.kv)
        self.router = AttnRouter(state, self.groups.group(initial_tp))
        self.models: Dict[int, ElasticLM] = {initial_tp: ElasticLM(dims, self.layout, self.router).to(self.device)}
        self.graphs = TPGraphSet(limits, self.device)
        self.controller = RescaleController(self, low_tps=2000.0, high_tps=12000.0)
        self.lock = threading.Lock()
        self.running: List[Seq] = []
        self.decoded_tokens_dev = torch.zeros((), dtype=torch.int64, device=self.device)
        self.logits_buf: Optional[torch.Tensor] = None
        self.out_host = torch.zeros(limits.max_batch, dtype=torch.int64, pin_memory=True)
        self.out_event = torch.cuda.Event()

    def _build_state(self, layout: TPLayout, kv: ShardedKVCache) -> TPAttnState:
        shared = self.shared_trt_ws if layout.tp == self.initial_tp else None
        st = TPAttnState(self.dims, self.limits, layout, kv, self.device, shared_trt_ws=shared)
        self.states[layout.tp] = st
        return st

    def _check_shards(self, sizes: List[int]) -> None:
        assert len(set(sizes)) == 1, "layers disagree on KV heads per rank"  # ok: FC109

    def start(self) -> None:
        self.graphs.record_degree(self.initial_tp, self.models[self.initial_tp], self.states[self.initial_tp])
        self.controller.start()

    @flashcheck.hot_path
    def step(self) -> None:
        # sampling of the previous step must be done before the flag exchange below
        torch.cuda.current_stream().synchronize()  # expect: FC101
        flag = torch.zeros(1, dtype=torch.int32)
        flag[0] = 0 if self.controller.pending() is None else 1
        dist.all_reduce(flag, group=self.groups.cpu_group)
        if flag.item():  # ok: FC101
            self.controller.acknowledge()
            return
        tp = int(self.tp_cpu[0])  # ok: FC101
        assert self.layout.tp == tp, "layout and TP degree diverged"  # ok: FC109
        if not self.groups.active(tp) or not self.running:
            return
        state = self.states[tp]
        batch = StepBatch.from_seqs(self.running, self.device)
        layout_np = self.pages.layout(batch.rows_np, batch.lens_np)
        if self.graphs.has(tp, batch.size):
            logits = self.graphs.replay_step(tp, state, batch, layout_np)
        else:
            state.plan_decode(*layout_np)
            logits = self.models[tp].decode(batch.input_ids, batch.positions)
        buf = self.logits_buf
        if buf is None:
            self.logits_buf = torch.empty((self.limits.max_batch, self.dims.vocab), dtype=torch.float32, device=self.device)  # ok: FC107
        full = self.groups.gather_vocab(logits, tp)
        self.logits_buf[: batch.size].copy_(full)
        next_ids = self.logits_buf[: batch.size].argmax(-1)
        self.decoded_tokens_dev += batch.size
        self.out_host[: batch.size].copy_(next_ids, non_blocking=True)
        self.out_event.record()

    def drain(self) -> List[int]:
        self.out_event.synchronize()
        n = len(self.running)
        toks = self.out_host[:n].tolist()
        for s, t in zip(self.running, toks):
            s.length += 1
            s.last_token = t
        return toks

    def rescale(self, new_tp: int) -> None:
        assert new_tp in self.limits.supported_tp, f"TP={new_tp} is not a supported degree"  # expect: FC109
        with self.lock:
            self._check_shards(self.kv.shard_sizes())
            old_layout = self.layout
            new_layout = layout_for(self.dims, new_tp, self.groups.rank)
            wide = max(old_layout.tp, new_tp)
            new_kv = reshard_kv_heads(
                self.kv, old_layout, new_layout, self.groups.group(wide), self.dims, self.limits, self.device
            )
            self.pages.compact()
            state = self.states.get(new_tp)
            if state is None:
                state = self._build_state(new_layout, new_kv)
                self.router.state = state
                self.router.group = self.groups.group(new_tp)
                self.models[new_tp] = ElasticLM(self.dims, new_layout, self.router).to(self.device)
                self.graphs.record_degree(new_tp, self.models[new_tp], state)
            else:
                state.kv = new_kv
                # graphs of this degree were recorded before the compaction: patch their page ids
                live = self.pages.live_indices_np(np.array([s.row for s in self.running], dtype=np.int64))
                state.graph_kv_indices[: live.size].copy_(torch.from_numpy(live).to(self.device))  # expect: FC104
                # the eager wrapper kept the workspace it planned with at the previous visit
                state.decode_wrapper._float_workspace_buffer = state.workspace  # expect: FC103
                self.router.state = state
                self.router.group = self.groups.group(new_tp)
            self.kv = new_kv
            self.layout = new_layout
            self.tp_cpu[0] = new_tp
