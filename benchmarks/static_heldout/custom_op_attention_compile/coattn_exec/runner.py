"""The model runner: plan outside the compiled region, set the forward context, run the
compiled model (piecewise graphs) or replay a full decode graph."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from coattn.config import CompileServeConfig
from coattn.forward_context import set_forward_context
from coattn_exec.metadata import SchedulerBatch
from coattn_exec.piecewise import PiecewiseGraphs
from coattn_exec.planner import ForwardPlanner
from coattn_layers.attention import FlashInferImpl
from coattn_layers.model import CompiledDecoder


class BlockOffloader:
    """Copies evicted KV blocks to pinned host memory on a side stream."""

    def __init__(self, kv_caches, num_host_blocks: int):
        self.kv_caches = kv_caches
        shape = (num_host_blocks,) + tuple(kv_caches[0].shape[1:])
        self.host = [torch.empty(shape, dtype=kv_caches[0].dtype, pin_memory=True) for _ in kv_caches]
        self.stream = torch.cuda.Stream()
        self.next_host = 0

    def copy_blocks(self, block_ids: torch.Tensor, n: int) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            dst = self.next_host
            for cache, host in zip(self.kv_caches, self.host):
                host[dst : dst + n].copy_(cache.index_select(0, block_ids.long()), non_blocking=True)
        self.next_host += n


class CompiledModelRunner:
    def __init__(self, cfg: CompileServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        shape = (cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.impls: Dict[str, FlashInferImpl] = {
            f"model.layers.{i}.self_attn": FlashInferImpl(
                f"model.layers.{i}.self_attn",
                cfg,
                self.kv_caches[i],
                cfg.sliding_window if cfg.is_window_layer(i) else None,
            )
            for i in range(cfg.num_layers)
        }
        self.model = CompiledDecoder(cfg, self.impls).to(device=device, dtype=torch.bfloat16)
        self.planner = ForwardPlanner(cfg, self.impls, device)
        self.graphs = PiecewiseGraphs(cfg, self.model.forward_decode, self.planner, device)
        self.model.compile(backend=self.graphs.compile_backend, dynamic=True)
        self.offloader = BlockOffloader(self.kv_caches, num_host_blocks=cfg.num_pages // 4)

    def update_limits(self, max_num_batched_tokens: int) -> None:
        self.planner.reserve_prefill_workspace(max_num_batched_tokens)
        self.cfg.max_num_batched_tokens = max_num_batched_tokens

    def capture_model(self) -> None:
        self.graphs.capturing = True
        for size in sorted(self.cfg.piecewise_sizes, reverse=True):
            self._dummy_run(size)
        self.graphs.capturing = False
        for bs in sorted(self.cfg.full_graph_sizes, reverse=True):
            self.graphs.record_full_decode(bs)

    def _dummy_run(self, num_tokens: int) -> None:
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        pos = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        with set_forward_context(None, self.impls, num_tokens):
            self.model(ids, pos)

    def _stage_offload(self, block_ids_cpu: torch.Tensor) -> None:
        # the copy kernel wants the ids in device memory; the decode graphs' index buffer is
        # large and idle once the step has run
        n = block_ids_cpu.shape[0]
        staging = self.planner.kv_indices_buf[:n]
        staging.copy_(block_ids_cpu, non_blocking=True)  # expect: FC104
        self.offloader.copy_blocks(staging, n)

    def execute_model(self, batch: SchedulerBatch) -> torch.Tensor:
        meta = self.planner.prepare_step(batch)
        n = meta.num_actual_tokens
        with set_forward_context(meta, self.impls, n):
            if meta.graph_size is not None:
                self.graphs.static_input_ids[:n].copy_(batch.input_ids[:n])
                hidden = self.graphs.replay_full(meta.graph_size)[:n]
            else:
                hidden = self.model(batch.input_ids, self.planner.positions[:n])
        if batch.evicted_blocks_cpu is not None:
            self._stage_offload(batch.evicted_blocks_cpu)
        last = torch.from_numpy(np.cumsum(batch.query_lens_np) - 1).to(self.device, non_blocking=True)
        return self.model.lm_head(hidden.index_select(0, last))


def dump_replay_state(runner: CompiledModelRunner) -> Dict[str, torch.Tensor]:
    """Debug endpoint: the buffers the next full-graph replay reads."""
    p = runner.planner
    names = ("kv_indptr_buf", "kv_indices_buf", "last_page_len_buf", "seq_lens_buf")
    return {name: t.cpu() for name, t in ((n, getattr(p, n)) for n in names)}  # ok: FC101
