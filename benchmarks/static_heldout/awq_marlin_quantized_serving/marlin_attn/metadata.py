"""Per-step attention metadata for the AWQ engine."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from awq.config import AWQServeConfig
from awq.paging import pages_for

logger = logging.getLogger(__name__)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    num_tokens_cpu: torch.Tensor
    is_prefill: bool


@dataclass
class PrefillMeta:
    qo_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    num_tokens: int
    max_pages: int


@dataclass
class DecodeMeta:
    batch_size: int
    num_pages: int
    seq_lens: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    long_rows: bool


MetaT = TypeVar("MetaT")


class MetadataBuilder(Generic[MetaT]):
    def __init__(self, cfg: AWQServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size

    def build(self, inputs: StepInputs) -> MetaT:
        raise NotImplementedError


class AWQMetadataBuilder(MetadataBuilder[PrefillMeta]):
    def build(self, inputs: StepInputs) -> PrefillMeta:
        num_tokens = int(inputs.num_tokens_cpu.sum())  # ok: FC101
        logger.debug("prefill metadata for lens %s", inputs.seq_lens)  # ok: FC101
        max_pages = pages_for(inputs.seq_lens, self.page_size)
        if max_pages > self.cfg.max_pages_per_seq:
            raise ValueError(f"a prompt needs {max_pages} pages; the limit is {self.cfg.max_pages_per_seq}")
        # the M-RoPE-free rotary kernel reads qo_indptr on the device
        qo_indptr = inputs.qo_indptr_cpu.to(self.device, non_blocking=True)
        return PrefillMeta(
            qo_indptr=qo_indptr,
            kv_indptr_cpu=inputs.kv_indptr_cpu,
            kv_indices=inputs.kv_indices,
            last_page_len_cpu=inputs.last_page_len_cpu,
            num_tokens=num_tokens,
            max_pages=max_pages,
        )

    def build_decode(self, inputs: StepInputs) -> DecodeMeta:
        bs = inputs.seq_lens_cpu.shape[0]
        num_pages = int(inputs.kv_indptr_cpu[-1])
        long_rows = bool((inputs.seq_lens_cpu > self.cfg.long_decode_threshold).any())
        return DecodeMeta(
            batch_size=bs,
            num_pages=num_pages,
            seq_lens=inputs.seq_lens,
            kv_indptr_cpu=inputs.kv_indptr_cpu,
            kv_indices=inputs.kv_indices,
            last_page_len_cpu=inputs.last_page_len_cpu,
            long_rows=long_rows,
        )
