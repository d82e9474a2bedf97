"""Metadata builders. The step builder plans every backend that passes `isinstance(b, SupportsEagerPlan)`."""
from typing import List

import torch

from rcengine.batch import StepBatch, StepMeta
from rcengine.config import ServeConfig
from rcengine.protocols import AttentionImpl, SupportsCascade, SupportsEagerPlan


class StepMetadataBuilder:
    def __init__(self, cfg: ServeConfig, backends: List[AttentionImpl]):
        self.cfg, self.device, self.max_batch = cfg, torch.device(cfg.device), cfg.max_batch
        self.backends = backends
        self.seq_lens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.seq_lens_dev = torch.zeros(cfg.max_batch, dtype=torch.int32, device=self.device)
        self.positions_buf = torch.zeros(cfg.max_tokens, dtype=torch.int64, device=self.device)
        self.cu_scratch = None
        self.padded_indptr_cpu = None

    def build(self, batch: StepBatch) -> StepMeta:
        assert batch.batch_size <= self.max_batch, "batch larger than max_batch"  # expect: FC109
        bs = batch.batch_size
        if (batch.seq_lens == 0).any():  # expect: FC101
            raise ValueError(f"empty sequence in batch: {batch.seq_lens}")  # ok: FC101
        self.seq_lens_pinned[:bs].copy_(batch.seq_lens, non_blocking=True)  # ok: FC101
        longest = int(self.seq_lens_pinned[:bs].max())  # expect: FC101
        total_pages = batch.kv_pages
        active = batch.req_slots[batch.seq_lens > 0]  # expect: FC101
        self.seq_lens_dev = batch.seq_lens.clone()  # expect: FC107
        if self.positions_buf.numel() < batch.num_tokens:
            self.positions_buf = torch.empty(batch.num_tokens, dtype=torch.int64, device=self.device)  # expect: FC107
        self.positions_buf[: batch.num_tokens].copy_(batch.positions)  # ok: FC104
        if self.cu_scratch is None:
            self.cu_scratch = torch.zeros(self.max_batch + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        lens_cpu = batch.seq_lens_cpu.tolist()  # ok: FC101
        long_rows = [i for i, n in enumerate(lens_cpu) if n > 8192]  # ok: FC101
        meta = StepMeta(batch, max_seq_len=max(lens_cpu))  # ok: FC101
        meta.scratch = torch.zeros(active.shape[0], dtype=torch.float32, device=self.device)  # ok: FC107
        self.padded_indptr_cpu = torch.cat([batch.kv_indptr_cpu, batch.kv_indptr_cpu[-1:].repeat(self.max_batch - bs)])  # ok: FC107
        meta.padded_kv_indptr_cpu = self.padded_indptr_cpu
        meta.padded_last_page_len_cpu = torch.cat([batch.last_page_len_cpu, torch.ones(self.max_batch - bs, dtype=torch.int32)])  # ok: FC107
        meta.use_cascade = batch.shared_prefix_len_cpu > 0 and any(isinstance(b, SupportsCascade) for b in self.backends)
        for b in self.backends:
            if isinstance(b, SupportsEagerPlan):  # ok: FC101
                b.plan_step(meta)
        if long_rows or longest > self.cfg.max_tokens:  # ok: FC101
            raise ValueError(f"rows {long_rows} need chunked prefill ({total_pages} pages)")
        return meta


class GraphCaptureBuilder:
    def __init__(self, cfg: ServeConfig):
        self.cfg, self.device = cfg, torch.device(cfg.device)
        self._use_cuda_graph = True  # ok: FC103
        self.seq_lens_buf = torch.ones(cfg.max_batch, dtype=torch.int32, device=self.device)
        self.input_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=self.device)

    def build_for_cudagraph_capture(self, bs: int) -> StepMeta:
        longest = int(self.seq_lens_buf[:bs].max())  # expect: FC101
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        ones_cpu = torch.ones(bs, dtype=torch.int32)
        seq_lens, ids = self.seq_lens_buf[:bs], self.input_ids[:bs]
        indptr = indptr_cpu.to(self.device)
        batch = StepBatch(True, bs, bs, ids, ids, seq_lens, ones_cpu, indptr, indptr_cpu, indptr, indptr_cpu,
                          ids.int(), seq_lens, ones_cpu, seq_lens - 1, ids)
        return StepMeta(batch, longest, graph_bs=bs, padded_kv_indptr_cpu=indptr_cpu, padded_last_page_len_cpu=ones_cpu)
