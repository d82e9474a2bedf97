"""Per-step attention metadata (TensorRT-LLM's FlashInferAttentionMetadata.prepare, split out)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

import numpy as np
import torch

logger = logging.getLogger(__name__)


@dataclass
class Request:
    req_id: int
    num_computed: int
    num_new: int
    page_ids: np.ndarray
    params: dict


@dataclass
class ScheduledBatch:
    requests: List[Request]
    input_ids_np: np.ndarray


@dataclass
class FlashInferAttentionMetadata:
    batch_size: int
    num_prefills: int
    num_decodes: int
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # pinned host mirror
    qo_indptr: torch.Tensor  # device
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor  # device
    kv_last_page_len_cpu: torch.Tensor
    num_kv_pages: int = 0
    max_seq_len: int = 0
    use_graph: bool = False
    kv_indptr_gpu: Optional[torch.Tensor] = None
    kv_last_page_len_gpu: Optional[torch.Tensor] = None
    slot_mapping: Optional[torch.Tensor] = None
    window_mask: Optional[torch.Tensor] = None


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor


class FlashInferMetadataBuilder:
    """Builds one FlashInferAttentionMetadata per scheduler step from host-side numpy data."""

    def __init__(self, cfg: Mapping[str, Any], device: torch.device):
        self.device = device
        attn = cfg["attention"]
        sched = {"max_batch_size": 64, "max_num_tokens": 8192, **cfg.get("scheduler", {})}
        self.page_size = int(attn.get("page_size", 16))
        self.window = attn.get("sliding_window", -1)
        self.hot_cfg = {"log_lengths": False, **cfg.get("hot_path", {})}
        self.max_tokens = int(sched["max_num_tokens"])
        self.max_bs = int(sched["max_batch_size"])
        self.alloc_buffers()

    def alloc_buffers(self) -> None:
        self.bufs = {
            name: torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
            for name in ("input_ids", "positions", "slot_mapping")
        }
        self.seq_lens_host = torch.zeros(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.zeros(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.positions_cpu = torch.zeros(self.max_tokens, dtype=torch.int64)

    def build(self, batch: ScheduledBatch) -> FlashInferAttentionMetadata:
        reqs = batch.requests
        bs = len(reqs)
        new_np = np.asarray([r.num_new for r in reqs], dtype=np.int32)
        seq_np = np.asarray([r.num_computed + r.num_new for r in reqs], dtype=np.int32)
        pages_np = (seq_np + self.page_size - 1) // self.page_size
        qo_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(new_np, out=qo_np[1:])
        kv_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=kv_np[1:])
        last_np = seq_np - (pages_np - 1) * self.page_size
        n_tok = int(qo_np[-1])
        num_prefills = int((new_np > 1).sum())

        if bs + 1 > self.kv_indptr_host.numel():
            self.kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
            self.seq_lens_host = torch.zeros(bs, dtype=torch.int32, pin_memory=True)
            self.last_page_host = torch.zeros(bs, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host[: bs + 1].copy_(torch.from_numpy(kv_np))
        self.seq_lens_host[:bs].copy_(torch.from_numpy(seq_np))
        self.last_page_host[:bs].copy_(torch.from_numpy(last_np))

        if n_tok > self.bufs["slot_mapping"].numel():
            self.bufs["slot_mapping"] = torch.empty(n_tok, dtype=torch.int64, device=self.device)  # expect: FC107
        if n_tok > self.positions_cpu.numel():
            self.positions_cpu = torch.empty(n_tok, dtype=torch.int64)  # ok: FC107

        seq_lens = self.seq_lens_host[:bs].to(self.device, non_blocking=True)
        qo_indptr = torch.from_numpy(qo_np).to(self.device, non_blocking=True)
        kv_indices = torch.from_numpy(np.concatenate([r.page_ids for r in reqs]).astype(np.int32)).to(
            self.device, non_blocking=True)
        new_lens = torch.from_numpy(new_np).to(self.device, non_blocking=True)
        kv_indptr_gpu = self.kv_indptr_host[: bs + 1].to(self.device, non_blocking=True)
        req_idx = torch.repeat_interleave(  # ok: FC101
            torch.arange(bs, device=self.device), new_lens, output_size=n_tok)
        self._fill_slots(req_idx, qo_indptr, kv_indptr_gpu, seq_lens, kv_indices, n_tok)

        meta = FlashInferAttentionMetadata(
            batch_size=bs,
            num_prefills=num_prefills,
            num_decodes=bs - num_prefills,
            seq_lens=seq_lens,
            seq_lens_cpu=self.seq_lens_host[:bs],
            qo_indptr=qo_indptr,
            qo_indptr_cpu=torch.from_numpy(qo_np),
            kv_indptr_cpu=self.kv_indptr_host[: bs + 1],
            kv_indices=kv_indices,
            kv_last_page_len_cpu=self.last_page_host[:bs],
        )
        meta.num_kv_pages = int(self.kv_indptr_host[bs])  # ok: FC101
        meta.max_seq_len = int(seq_lens.max())  # expect: FC101
        meta.kv_indptr_gpu = kv_indptr_gpu
        meta.kv_last_page_len_gpu = torch.empty(bs, dtype=torch.int32, device=self.device)  # ok: FC107
        meta.kv_last_page_len_gpu.copy_(self.last_page_host[:bs], non_blocking=True)
        meta.slot_mapping = self.bufs["slot_mapping"][:n_tok]

        if self.window > 0 and bool((seq_lens > self.window).any()):  # expect: FC101
            meta.window_mask = seq_lens > self.window
        if self.hot_cfg.get("log_lengths", False):  # ok: FC101
            logger.debug("step lens=%s qo_indptr=%s", seq_lens, qo_indptr)  # ok: FC101
        return meta

    def _fill_slots(self, req_idx, qo_indptr, kv_indptr, seq_lens, kv_indices, n_tok: int) -> None:
        tok = torch.arange(n_tok, device=self.device)
        pos = seq_lens[req_idx] - (qo_indptr[req_idx + 1] - tok)
        self.bufs["positions"][:n_tok].copy_(pos)
        page = kv_indices[kv_indptr[req_idx] + pos // self.page_size]
        self.bufs["slot_mapping"][:n_tok].copy_(page.long() * self.page_size + pos % self.page_size)

    def stage_inputs(self, batch: ScheduledBatch, meta: FlashInferAttentionMetadata) -> StepInputs:
        n_tok = batch.input_ids_np.shape[0]
        ids = torch.from_numpy(batch.input_ids_np).pin_memory()
        self.bufs["input_ids"][:n_tok].copy_(ids, non_blocking=True)
        return StepInputs(input_ids=self.bufs["input_ids"][:n_tok], positions=self.bufs["positions"][:n_tok])
