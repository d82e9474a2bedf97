"""The per-step executor: schedule -> metadata -> graph replay or eager forward -> sample."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, List, Optional

import torch

from snapattn.flashinfer_backend import FlashInferBackend
from snapserve.batch import BatchState, Request
from snapserve.config import EngineConfig
from snapserve.metadata import (
    BlockTableView,
    DecodeMetadata,
    RequestUpdate,
    fold_host_updates,
    fold_request_updates,
)
from snapruntime.graph_runner import CudaGraphRunner
from snapruntime.model import TinyModel
from snapruntime.sampler import Sampler, SamplingMetadata


class StepExecutor:
    def __init__(self, cfg: EngineConfig, device: torch.device, use_cuda_graphs: bool = True):
        self.cfg = cfg.resolved()
        self.device = device
        self.batch = BatchState(self.cfg, device)
        self.backend = FlashInferBackend(self.cfg, device)
        self.model = TinyModel(self.cfg, self.backend, device)
        self.runner = CudaGraphRunner(self.cfg, self.model, self.backend)
        self.sampler = Sampler(self.cfg, device)
        self.use_cuda_graphs = use_cuda_graphs
        self.view_proto = BlockTableView(self.batch.block_table, self.batch.seq_lens, self.batch.seq_lens_cpu)
        self.tokens_host = torch.zeros(self.cfg.max_num_reqs, dtype=torch.long, device="cpu", pin_memory=True)
        self.tokens_ready = torch.cuda.Event()
        self.last_bucket = 0
        self.last_num_reqs = 0
        self.step_meta: Optional[DecodeMetadata] = None
        self.host_meta: Optional[DecodeMetadata] = None
        self.next_free_page = 0

    def _ensure_pages(self, req: Request) -> None:
        need = (req.seq_len + self.cfg.page_size - 1) // self.cfg.page_size
        while len(req.pages) < need:
            if self.next_free_page >= self.cfg.max_total_pages:
                raise RuntimeError(f"KV cache full ({self.cfg.max_total_pages} pages)")
            req.pages.append(self.next_free_page)
            self.next_free_page += 1

    def warmup(self) -> None:
        if self.use_cuda_graphs:
            self.runner.capture_all()

    def execute_step(self, requests: List[Request], sampling: SamplingMetadata) -> int:
        batch = self.batch
        batch.fill(requests)
        batch.upload()
        n = batch.num_reqs

        if batch.is_decode and self.use_cuda_graphs and n <= self.runner.max_bs:
            hidden = self.runner.replay(batch)
            self.last_bucket = self.runner.bucket_for(n)
            self.step_meta = self.runner.current[self.last_bucket]
        elif batch.is_decode and n > self.runner.max_bs:
            view = (
                self.view_proto.clone()
                .with_seq_lens(batch.seq_lens[:n], batch.seq_lens_cpu[:n])
                .with_block_table(batch.block_table[:n])
            )
            if view.seq_lens.max() >= self.cfg.max_seq_len:  # expect: FC101
                raise RuntimeError("a request reached max_seq_len; the scheduler should have finished it")
            hidden = self.model.decode_overflow(batch.input_ids[:n], batch.positions[:n], view)
            self.step_meta = None
        elif batch.is_decode:
            self.backend.init_forward_metadata(batch)
            self.step_meta = self.backend.forward_meta
            hidden = self.model.decode(batch.input_ids[:n], batch.positions[:n], self.step_meta)
        else:
            self.backend.init_forward_metadata(batch)
            t = batch.num_tokens
            hidden = self.model.extend(batch.input_ids[:t], batch.positions[:t], batch.slot_mapping[:t])
            last_rows = batch.qo_indptr_cpu[1 : n + 1].long() - 1
            hidden = hidden[last_rows.to(self.device, non_blocking=True)]
            self.step_meta = None

        logits = self.model.logits(hidden)
        tokens = self.sampler.sample(logits, sampling)
        if n > self.tokens_host.numel():
            self.tokens_host = torch.zeros(2 * n, dtype=torch.long, device="cpu", pin_memory=True)  # ok: FC107
        self.tokens_host[:n].copy_(tokens, non_blocking=True)
        self.tokens_ready.record()
        self.last_num_reqs = n
        return n

    def after_accept(self, accepted: torch.Tensor, accepted_cpu: List[int]) -> None:
        """Speculative decoding: fold the accepted draft tokens of the last decode step into its metadata."""
        if self.step_meta is None:
            return
        n = self.last_num_reqs
        cur = self.runner.current_or_captured(self.last_bucket) if self.use_cuda_graphs else self.step_meta
        cur.seq_lens[:n].add_(accepted[:n])  # ok: FC104
        cur.kv_last_page_len[:n].add_(accepted[:n]).sub_(1).remainder_(self.cfg.page_size).add_(1)  # expect: FC104

        spec = replace(cur, kv_last_page_len=self.backend.spec_last_page_scratch[:n])
        spec.kv_last_page_len.copy_(cur.kv_last_page_len_cpu[:n], non_blocking=True)  # ok: FC104

        updates = [RequestUpdate(i, accepted[i], accepted_cpu[i]) for i in range(n)]
        self.step_meta = fold_request_updates(spec, updates)
        self.host_meta = fold_host_updates(spec, updates)

        new_lens = cur.seq_lens[:n]
        self.view_proto = self.view_proto.with_seq_lens(new_lens, new_lens.cpu())  # expect: FC101

    def collect_tokens(self) -> List[int]:
        self.tokens_ready.synchronize()
        return self.tokens_host[: self.last_num_reqs].tolist()  # ok: FC101

    def generate(self, requests: List[Request], max_steps: int) -> Iterable[List[int]]:
        self.warmup()
        for _ in range(max_steps):
            live = [r for r in requests if r.seq_len < self.cfg.max_seq_len]
            if not live:
                return
            for r in live:
                self._ensure_pages(r)
            sampling = SamplingMetadata.from_requests(live, self.device)
            self.execute_step(live, sampling)
            tokens = self.collect_tokens()
            for r, tok in zip(live, tokens):
                r.num_computed = r.seq_len
                r.output_ids.append(tok)
            yield tokens


def make_executor(cfg: EngineConfig, device: str = "cuda") -> StepExecutor:
    return StepExecutor(cfg.with_env(), torch.device(device))


def backend_of(executor: StepExecutor) -> FlashInferBackend:
    return executor.backend


__all__ = ["StepExecutor", "make_executor", "backend_of", "BatchState", "TinyModel", "CudaGraphRunner"]
