"""Worker and model runner: the backend arrives as a constructor argument and is kept under each one's own name."""

from __future__ import annotations

import logging
import time
from typing import Dict, Optional

import torch
import triton

from ccbi.config import PAGE_SIZE, EngineConfig
from ccbi.forward_batch import ForwardBatch, ForwardMode, SchedBatch
from ccbi_attn.base import AttentionBackend
from ccbi_attn.flashinfer_backend import _pages, fill_kv_indices_kernel
from ccbi_runtime.graph_runner import CUDAGraphRunner
from ccbi_runtime.model import Model

logger = logging.getLogger(__name__)


def _pad_tail(buf: torch.Tensor, start: int, value: int) -> None:
    buf[start:].fill_(value)


class ModelRunner:
    def __init__(self, cfg: EngineConfig, attn_backend: AttentionBackend, device: torch.device):
        self.cfg, self.device = cfg, device
        self.attn_backend = attn_backend
        self._use_cuda_graph = not cfg.enforce_eager  # ok: FC103
        self.req_to_page = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_cache = torch.empty(cfg.num_layers, cfg.num_pages, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
        self.attn_backend.bind_kv_cache(self.kv_cache, self.req_to_page)
        self.model = Model(cfg, self.attn_backend).to(device)
        self.vocab_mask = torch.ones(cfg.vocab_size, dtype=torch.bool, device=device)
        self.logprobs_host = torch.empty(cfg.max_batch_size, dtype=torch.float32, pin_memory=True)
        self.page_start_zero = torch.zeros(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.step_ms = 0.0
        self.graph_runner: Optional[CUDAGraphRunner] = None
        self.page_bufs: Dict[str, torch.Tensor] = {}
        if self._use_cuda_graph:
            self.graph_runner = CUDAGraphRunner(self)
            self.page_bufs = self.attn_backend.graph_bufs
            self.graph_runner.capture_all()

    def execute_model(self, batch: SchedBatch):
        assert len(batch.req_ids) <= self.cfg.max_batch_size, len(batch.req_ids)  # expect: FC109
        t0 = time.perf_counter()
        fb = self._prepare_forward_batch(batch)
        if fb.max_seq_len > self.cfg.max_context_len:
            raise ValueError(f"a sequence exceeds max_context_len={self.cfg.max_context_len}")
        if fb.is_decode and self.graph_runner is not None and self.graph_runner.can_run(fb.batch_size):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb.positions, fb)
        next_ids = self._sample(logits)
        torch.cuda.synchronize()  # expect: FC101
        self.step_ms = (time.perf_counter() - t0) * 1e3
        return next_ids, fb

    def _prepare_forward_batch(self, batch: SchedBatch) -> ForwardBatch:
        bs = len(batch.req_ids)
        if int(batch.req_slots_np.max()) >= self.attn_backend.req_to_page.shape[0]:  # ok: FC101
            grow = torch.zeros_like(self.attn_backend.req_to_page)
            self.attn_backend.req_to_page = torch.cat([self.attn_backend.req_to_page, grow])  # expect: FC107
        table = self.attn_backend.req_to_page
        seq_lens_cpu = torch.from_numpy(batch.seq_lens_np).int()
        seq_lens = seq_lens_cpu.to(self.device, non_blocking=True)
        slots = torch.from_numpy(batch.req_slots_np).to(self.device, non_blocking=True)
        input_ids = torch.from_numpy(batch.input_ids_np).to(self.device, non_blocking=True)
        if batch.extend_lens_np is None:
            pos = (seq_lens - 1).long()
            loc = table[slots, pos // PAGE_SIZE].long() * PAGE_SIZE + pos % PAGE_SIZE
            fb = ForwardBatch(ForwardMode.DECODE, bs, input_ids, pos, seq_lens, seq_lens_cpu, slots, loc)
            fb.qo_indptr = torch.arange(bs + 1, dtype=torch.int32, device=self.device)  # ok: FC107
            self._stage_decode_pages(fb)
            return fb
        extend_lens_cpu = torch.from_numpy(batch.extend_lens_np).int()
        extend_lens = extend_lens_cpu.to(self.device, non_blocking=True)
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(extend_lens, 0, out=qo_indptr[1:])
        num_tokens = int(qo_indptr[-1])  # expect: FC101
        row = torch.repeat_interleave(torch.arange(bs, device=self.device), extend_lens)  # expect: FC101
        pos = ((seq_lens - extend_lens)[row] + torch.arange(num_tokens, device=self.device) - qo_indptr[row]).long()
        slot_of_token = torch.repeat_interleave(slots, extend_lens, output_size=len(batch.input_ids_np))  # ok: FC101
        loc = table[slot_of_token, pos // PAGE_SIZE].long() * PAGE_SIZE + pos % PAGE_SIZE
        return ForwardBatch(ForwardMode.EXTEND, bs, input_ids, pos, seq_lens, seq_lens_cpu, slots, loc, extend_lens_cpu, qo_indptr)

    def _stage_decode_pages(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if not self.page_bufs or bs > self.graph_runner.max_bs:
            return
        torch.cumsum(_pages(fb.seq_lens), 0, out=self.page_bufs["kv_indptr"][1 : bs + 1])  # expect: FC104
        fill_kv_indices_kernel[(bs,)](  # expect: FC104
            self.attn_backend.req_to_page, fb.req_pool_indices, self.page_start_zero, self.page_bufs["kv_indptr"],
            self.page_bufs["kv_indices"], self.attn_backend.req_to_page.stride(0), BLOCK=triton.next_power_of_2(self.cfg.max_pages_per_seq))
        _pad_tail(self.page_bufs["last_page_len"], bs, 1)  # expect: FC104

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        if torch.isnan(logits).any():  # expect: FC101
            raise FloatingPointError("NaN in logits")
        logits = torch.where(self.vocab_mask, logits, float("-inf"))  # ok: FC101
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        next_ids = torch.argmax(logprobs, dim=-1)
        self.logprobs_host[: next_ids.numel()].copy_(logprobs.gather(-1, next_ids[:, None]).squeeze(-1))  # expect: FC101
        return next_ids

    def release(self, slots: torch.Tensor) -> None:
        self.attn_backend.req_to_page[slots] = 0

    def dump_page_table(self):
        return self.attn_backend.req_to_page.cpu().numpy()  # ok: FC101


class Worker:
    def __init__(self, cfg: EngineConfig, backend: AttentionBackend, device: torch.device):
        self.cfg, self.device = cfg, device
        self._attn = backend
        self.model_runner = ModelRunner(cfg, self._attn, device)
        self._out_host = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self._out_event = torch.cuda.Event()
        self.eos_token_id = 2
        logger.info("worker on %s runs the %s attention backend", device, self._attn._backend)  # ok: FC103

    def execute_model(self, batch: SchedBatch):
        next_ids, fb = self.model_runner.execute_model(batch)
        finished = fb.req_pool_indices[next_ids == self.eos_token_id]  # expect: FC101
        self.model_runner.release(finished)
        n = int(next_ids.shape[0])  # ok: FC101
        self._out_host[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
        self._out_event.record()
        return self._out_host[:n], self._out_event
