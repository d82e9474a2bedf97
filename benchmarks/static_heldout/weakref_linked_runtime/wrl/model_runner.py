"""The model runner: owner of every long-lived resource, and the per-step entry point.

``RuntimeResources`` holds the device memory strongly; the runner itself exposes it to the other
components only as ``weakref.proxy`` objects. ``release_memory()`` (sleep mode between RL
rollouts) drops the resources, after which a stale user raises ``ReferenceError`` instead of
silently keeping tens of GiB alive.
"""

from __future__ import annotations

import gc
import logging
import weakref
from typing import Optional

import numpy as np
import torch

from wrl.attention import FlashInferAttnBackend
from wrl.batch import ForwardBatch, ForwardMode, ScheduleBatch, StepOutput
from wrl.buffers import GraphBufferPool, InputBuffers, PinnedStagingPool, WorkspaceArena
from wrl.config import EngineConfig
from wrl.graph_runner import CudaGraphRunner
from wrl.hooks import KVUsageReporter, LengthChecker, MetricsCollector, StepHookRegistry, StopChecker
from wrl.kv_pool import PagedKVPool
from wrl.model import DecoderModel

logger = logging.getLogger(__name__)


class RuntimeResources:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.arena = WorkspaceArena(cfg, device)
        self.input_buffers = InputBuffers(cfg, device)
        self.graph_buffers = GraphBufferPool(cfg, device)
        self.kv_pool = PagedKVPool(cfg, device, self.graph_buffers)
        self.staging = PinnedStagingPool(num_slots=4, slot_tokens=cfg.max_num_tokens)


class Sampler:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.next_ids_host = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)

    def sample(self, logits: torch.Tensor, fb: ForwardBatch, stream: torch.cuda.Stream) -> StepOutput:
        bs = fb.batch_size
        next_ids = torch.argmax(logits[:bs], dim=-1)
        host = self.next_ids_host[:bs]
        host.copy_(next_ids, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(stream)
        return StepOutput(next_token_ids=next_ids, seq_lens=fb.seq_lens + 1, next_token_ids_host=host, ready=ready)


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: str = "cuda:0"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        self._kv_layout = "NHD"
        self.resources: Optional[RuntimeResources] = RuntimeResources(cfg, self.device)
        self._bind_resources()

        self.attn_backend = FlashInferAttnBackend(self)
        self.model = DecoderModel(cfg, self.attn_backend).to(self.device, dtype=getattr(torch, cfg.dtype))
        self.sampler = Sampler(cfg, self.device)
        self.graph_runner = CudaGraphRunner(self)
        self._logits_indices: Optional[torch.Tensor] = None
        self._positions_host = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, pin_memory=True)

        self.step_end_hooks = StepHookRegistry("step_end")
        self.shutdown_hooks = StepHookRegistry("shutdown")
        self.metrics = MetricsCollector()
        self.stop_checker = StopChecker(cfg.eos_token_id)
        self.length_checker = LengthChecker(cfg.max_context_len)
        self.kv_usage = KVUsageReporter(cfg.page_size, self.resources.graph_buffers)
        self.step_end_hooks.register(self.metrics.on_step_end)
        self.step_end_hooks.register(self.stop_checker.on_step_end)
        self.step_end_hooks.register(self.length_checker.on_step_end)
        self.step_end_hooks.register(self.kv_usage.on_step_end)
        self.shutdown_hooks.register(self.metrics.on_shutdown)
        self._last: Optional[tuple[ScheduleBatch, StepOutput]] = None

    def _bind_resources(self) -> None:
        res = self.resources
        self.arena = weakref.proxy(res.arena)
        self.input_buffers = weakref.proxy(res.input_buffers)
        self.graph_buffers = weakref.proxy(res.graph_buffers)
        self.kv_pool = weakref.proxy(res.kv_pool)
        self.staging = weakref.proxy(res.staging)

    # ------------------------------------------------------------------ lifecycle

    def init_cuda_graphs(self) -> None:
        if self.cfg.enable_cuda_graph:
            self.graph_runner.capture()

    def enable_prefix_sharing(self, prefix_pages: torch.Tensor, prefix_len: int) -> None:
        from wrl_ext.prefix_share import SharedPrefixDecode

        self._prefix = SharedPrefixDecode(self, prefix_pages, prefix_len)
        self.attn_backend.attach_prefix_sharing(self._prefix)

    def enable_trtllm_decode(self) -> None:
        from wrl_ext.trtllm_decode import TrtllmGenDecode

        self._trtllm = TrtllmGenDecode(self)
        self.attn_backend.attach_trtllm(self._trtllm)

    def release_memory(self) -> None:
        """Sleep mode: graphs first (they hold the wrappers), then every resource."""
        self.graph_runner.drop_graphs()
        self.attn_backend.release()
        self.resources = None
        gc.collect()

    def wake_up(self) -> None:
        self.resources = RuntimeResources(self.cfg, self.device)
        self._bind_resources()
        self.attn_backend.rebind(self)
        self.kv_usage = KVUsageReporter(self.cfg.page_size, self.resources.graph_buffers)
        self.step_end_hooks.register(self.kv_usage.on_step_end)
        self.init_cuda_graphs()

    def shutdown(self) -> None:
        if self._last is not None:
            self.shutdown_hooks.fire(*self._last)
        self.release_memory()

    # ------------------------------------------------------------------ per step

    def _prepare_forward_batch(self, batch: ScheduleBatch) -> ForwardBatch:
        ib = self.input_buffers
        bs = batch.batch_size
        n = batch.num_tokens
        ib.seq_lens_cpu[:bs].copy_(torch.from_numpy(batch.seq_lens_np))
        ib.seq_lens[:bs].copy_(ib.seq_lens_cpu[:bs], non_blocking=True)
        ib.req_pool_indices[:bs].copy_(torch.from_numpy(batch.req_pool_indices_np), non_blocking=True)

        if batch.forward_mode.is_decode():
            positions_np = batch.seq_lens_np.astype(np.int64) - 1
            qo_indptr_np = np.arange(bs + 1, dtype=np.int32)
        else:
            starts = batch.seq_lens_np - batch.extend_lens_np
            positions_np = np.concatenate([np.arange(s, e) for s, e in zip(starts, batch.seq_lens_np)])
            qo_indptr_np = np.concatenate([[0], np.cumsum(batch.extend_lens_np)]).astype(np.int32)
        if n > self._positions_host.numel():
            self._positions_host = torch.zeros(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self._positions_host[:n].copy_(torch.from_numpy(positions_np))
        ib.positions[:n].copy_(self._positions_host[:n], non_blocking=True)
        ib.qo_indptr_cpu[: bs + 1].copy_(torch.from_numpy(qo_indptr_np))
        ib.qo_indptr[: bs + 1].copy_(ib.qo_indptr_cpu[: bs + 1], non_blocking=True)
        ib.cu_seq_lens_kv_cpu[0] = 0
        torch.cumsum(ib.seq_lens_cpu[:bs], 0, dtype=torch.int32, out=ib.cu_seq_lens_kv_cpu[1 : bs + 1])
        ib.cu_seq_lens_kv[: bs + 1].copy_(ib.cu_seq_lens_kv_cpu[: bs + 1], non_blocking=True)

        fb = ForwardBatch(
            forward_mode=batch.forward_mode,
            batch_size=bs,
            seq_lens=ib.seq_lens[:bs],
            seq_lens_cpu=ib.seq_lens_cpu[:bs],
            req_pool_indices=ib.req_pool_indices[:bs],
            out_cache_loc=ib.out_cache_loc[:n],
            positions=ib.positions[:n],
        )
        fb.use_graph = self.graph_runner.can_run(fb)
        if batch.forward_mode.is_extend():
            # last token of each request: the only rows the LM head needs
            if self._logits_indices is None:
                self._logits_indices = torch.empty(self.cfg.max_batch_size, dtype=torch.int64, device=self.device)  # ok: FC107
            fb.logits_indices = self._logits_indices[:bs]
            torch.sub(ib.qo_indptr[1 : bs + 1], 1, out=fb.logits_indices)
        return fb

    def _allocate_pages(self, batch: ScheduleBatch) -> None:
        if batch.new_pages_np is None:
            return
        total = int(batch.new_pages_np.sum())
        if total == 0:
            return
        if batch.forward_mode.is_decode():
            pages = torch.from_numpy(self.kv_pool.alloc_decode_pages(total)).to(self.device, non_blocking=True)
        else:
            pages = self.kv_pool.alloc_prefill_pages(total)
        needs = batch.new_pages_np > 0
        first_page_np = (batch.seq_lens_np[needs] - 1) // self.cfg.page_size
        self.kv_pool.assign(batch.req_pool_indices_np[needs], first_page_np, pages)

    def step(self, batch: ScheduleBatch) -> StepOutput:
        if batch.num_tokens > self.input_buffers.input_ids.numel():
            # the chunked-prefill budget was raised at run time
            self.input_buffers.input_ids = torch.zeros(batch.num_tokens, dtype=torch.int64, device=self.device)  # expect: FC107
        self._allocate_pages(batch)
        fb = self._prepare_forward_batch(batch)
        n = batch.num_tokens

        lease = self.staging.acquire(n)
        lease.host.copy_(torch.from_numpy(batch.input_ids_np))
        self.input_buffers.input_ids[:n].copy_(lease.host, non_blocking=True)
        lease.mark_queued(self.stream)

        with torch.cuda.stream(self.stream):
            if fb.use_graph:
                logits = self.graph_runner.replay(fb)
            else:
                self.attn_backend.init_forward_metadata(fb)
                ids = self.input_buffers.input_ids[:n]
                if fb.forward_mode == ForwardMode.DECODE:
                    logits = self.model.decode_step(ids, fb.positions, fb)
                else:
                    logits = self.model.prefill_step(ids, fb.positions, fb)
            out = self.sampler.sample(logits, fb, self.stream)

        self.step_end_hooks.fire(batch, out)
        self._last = (batch, out)
        if self.kv_pool.fragmentation() > self.cfg.compaction_threshold:
            self.kv_pool.compact(self._compaction_moves())
        del lease  # the slot returns to the pool; reused once its copy has completed
        return out

    def _compaction_moves(self) -> np.ndarray:
        used = np.flatnonzero(~self.kv_pool.free_mask_np)
        holes = np.flatnonzero(self.kv_pool.free_mask_np[: used[-1] + 1])
        holes = holes[holes > 0]
        movers = used[::-1][: holes.shape[0]]
        keep = movers > holes[: movers.shape[0]]
        return np.stack([movers[keep], holes[: movers.shape[0]][keep]], axis=1)
