"""Model runner and the per-bucket decode graphs that cover both gated delta-net and full-attention layers."""
from __future__ import annotations

import bisect
import logging
from typing import Dict, Optional, Tuple

import torch

from q3n.attn import FlashInferFullAttnBackend, GDNAttnBackend, HybridLinearAttnBackend
from q3n.cache import MambaStatePool
from q3n.model import Qwen3NextForCausalLM
from q3n.schema import EngineLimits, ForwardBatch, ForwardMode, Qwen3NextConfig, ScheduledBatch

logger = logging.getLogger(__name__)


class HybridGraphRunner:
    """One CUDA graph per batch-size bucket; each graph runs all 48 layers (GDN and full attention)."""

    def __init__(self, model_runner: "HybridModelRunner"):
        self.model_runner = model_runner
        self.model = model_runner.model
        self.attn_backend = model_runner.attn_backend
        limits = model_runner.limits
        self.capture_bs = sorted(limits.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.tokens_per_req = limits.num_speculative_tokens + 1
        max_tokens = self.max_bs * self.tokens_per_req
        with torch.device(model_runner.device):
            self.input_ids = torch.zeros(max_tokens, dtype=torch.int64)
            self.positions = torch.zeros(max_tokens, dtype=torch.int64)
            self.out_cache_loc = torch.zeros(max_tokens, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.mamba_slots = torch.zeros(self.max_bs, dtype=torch.int32)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[Tuple[int, int]] = None
        self.attn_backend.full_attn.init_cuda_graph_state(self.max_bs)
        self.capture()

    def _static_batch(self, bs: int) -> ForwardBatch:
        n = bs * self.tokens_per_req
        return ForwardBatch(
            ForwardMode.DECODE, bs, self.input_ids[:n], self.positions[:n], self.req_pool_indices[:bs], self.seq_lens[:bs],
            self.seq_lens_cpu[:bs], self.mamba_slots[:bs], self.out_cache_loc[:n], self.attn_backend,
            tokens_per_req=self.tokens_per_req,
        )

    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.capture_bs):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.outputs[bs] = out
        torch.cuda.synchronize()
        logger.info("captured %d hybrid decode graphs", len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> Tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        fb = self._static_batch(bs)
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        logger.info(f"capturing hybrid decode graph bs={bs} over state slots {fb.mamba_slots}")  # expect: FC101
        model = self.model

        def run_once() -> torch.Tensor:
            return model.decode(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        return graph, out

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        n_raw = raw_bs * self.tokens_per_req
        if bs != raw_bs:
            self.seq_lens.fill_(1)
            self.seq_lens_cpu.fill_(1)
            self.req_pool_indices.zero_()
            self.mamba_slots.zero_()
        self.input_ids[:n_raw].copy_(fb.input_ids)
        self.positions[:n_raw].copy_(fb.positions)
        self.out_cache_loc[:n_raw].copy_(fb.out_cache_loc)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.mamba_slots[:raw_bs].copy_(fb.mamba_slots)
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, self._static_batch(bs))
        self.graphs[bs].replay()
        return self.outputs[bs][:n_raw]


class HybridModelRunner:
    def __init__(self, cfg: Qwen3NextConfig, limits: EngineLimits, device: torch.device):
        self.cfg = cfg
        self.limits = limits
        self.device = device
        num_req_rows = limits.max_running_requests + 1
        self.req_to_page = torch.zeros(num_req_rows, limits.max_pages_per_req, dtype=torch.int32, device=device)
        self.req_to_slot = torch.zeros(num_req_rows, dtype=torch.int32, device=device)
        self.state_pool = MambaStatePool(cfg, limits, device)
        full = FlashInferFullAttnBackend(cfg, limits, self.req_to_page, device)
        linear = GDNAttnBackend(cfg, limits, self.state_pool, device, cfg.linear_conv_kernel_dim)
        self.attn_backend = HybridLinearAttnBackend(full, linear)
        self.model = Qwen3NextForCausalLM(cfg).to(device)
        max_out = limits.max_running_requests * (limits.num_speculative_tokens + 1)
        self.next_ids_pinned = torch.zeros(max_out, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.graph_runner: Optional[HybridGraphRunner] = None
        if limits.cuda_graph_bs:
            self.graph_runner = HybridGraphRunner(self)

    def _build_forward_batch(self, sched: ScheduledBatch) -> ForwardBatch:
        dev = self.device
        req_pool_indices = sched.req_pool_indices_cpu.to(dev, non_blocking=True)
        fb = ForwardBatch(
            forward_mode=sched.forward_mode, batch_size=sched.req_pool_indices_cpu.numel(),
            input_ids=sched.input_ids_cpu.to(dev, non_blocking=True), positions=sched.positions_cpu.to(dev, non_blocking=True),
            req_pool_indices=req_pool_indices, seq_lens=sched.seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=sched.seq_lens_cpu, mamba_slots=self.req_to_slot[req_pool_indices.long()],
            out_cache_loc=sched.out_cache_loc, attn_backend=self.attn_backend,
        )
        if sched.forward_mode.is_extend():
            fb.extend_seq_lens = torch.tensor(sched.extend_seq_lens_cpu, dtype=torch.int32).to(dev, non_blocking=True)
            fb.extend_prefix_lens = torch.tensor(sched.extend_prefix_lens_cpu, dtype=torch.int32).to(dev, non_blocking=True)
            fb.extend_seq_lens_cpu = sched.extend_seq_lens_cpu
        return fb

    def forward_step(self, sched: ScheduledBatch) -> None:
        num_new = sched.new_req_pool_indices_cpu.numel()
        if num_new > 0:
            slots = self.state_pool.alloc(num_new)
            new_rows = sched.new_req_pool_indices_cpu.to(self.device, non_blocking=True)
            self.req_to_slot[new_rows.long()] = slots
        num_finished = sched.finished_req_pool_indices_cpu.numel()
        if num_finished > 0:
            done_rows = sched.finished_req_pool_indices_cpu.to(self.device, non_blocking=True)
            self.state_pool.free(self.req_to_slot[done_rows.long()], num_finished)
        fb = self._build_forward_batch(sched)
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb.positions, fb)
        next_ids = torch.argmax(logits, dim=-1)
        n = next_ids.shape[0]
        self.next_ids_pinned[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.copy_done.record()
        sched.num_output_ids = n
        sched.output_ready = self.copy_done  # the scheduler reads next_ids_pinned after this event

    # ------------------------------------------------------------------ maintenance (not per step)
    def on_pages_moved(self, remap: torch.Tensor) -> None:
        """KV defragmentation moved pages: rewrite page ids in the page table and in the decode indices."""
        self.req_to_page.copy_(remap[self.req_to_page.long()])
        kv_indices = self.attn_backend.full_attn.kv_indices
        kv_indices.copy_(remap[kv_indices.long()])  # expect: FC104

    def memory_report(self) -> Dict[str, int]:
        full = self.attn_backend.full_attn
        report = {
            "kv_cache": sum(t.numel() * t.element_size() for t in full.k_caches + full.v_caches),
            "mamba_state": self.state_pool.bytes_per_slot() * self.state_pool.size,
        }
        report["prefill_workspace"] = full.prefill_wrapper._float_workspace_buffer.numel()  # expect: FC103
        logger.info("full-attention KV layout %s", full._kv_layout)  # ok: FC103
        return report
