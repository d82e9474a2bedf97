"""Eager FlashInfer attention: prefill, mixed batches and decode batches above the largest bucket.

The eager path plans the prototype wrappers of the ``DecodeWrapperSet`` directly. It owns a
private ``DecodeBuffers`` (a deep copy of the prototype's), so nothing it writes is read by
a captured graph.
"""

from __future__ import annotations

import copy
import logging

import torch

from protoserve.attention.context import AttnContext
from protoserve.attention.wrappers import DecodeWrapperSet
from protoserve.buffers import DecodeBuffers
from protoserve.config import EngineConfig
from protoserve.metadata import StepMetadata

logger = logging.getLogger(__name__)


class FlashInferEagerBackend:
    def __init__(
        self,
        cfg: EngineConfig,
        wrappers: DecodeWrapperSet,
        eager_bufs: DecodeBuffers,
        device: torch.device,
    ):
        self.cfg = cfg
        self.wrappers = wrappers
        self.eager_bufs = eager_bufs
        self.device = device

    def init_forward_metadata(self, meta: StepMetadata) -> None:
        cfg = self.cfg
        n = meta.batch_size
        nnz = int(meta.kv_indptr_cpu[n])
        bufs = self.eager_bufs
        bufs.kv_indptr[: n + 1].copy_(meta.kv_indptr_cpu[: n + 1], non_blocking=True)
        bufs.kv_last_page_len[:n].copy_(meta.kv_last_page_len_cpu[:n], non_blocking=True)
        if meta.page_ids is not None:
            bufs.kv_indices[:nnz].copy_(meta.page_ids[:nnz], non_blocking=True)
        if meta.qo_indptr is not None:
            self.wrappers.prefill.plan(  # expect: FC102
                meta.qo_indptr,
                meta.kv_indptr_cpu[: n + 1],
                bufs.kv_indices[:nnz],
                meta.kv_last_page_len_cpu[:n],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
                q_data_type=cfg.kv_dtype,
                kv_data_type=cfg.kv_dtype,
            )
            return
        # decode: plan from a shallow copy of the record whose tensor slots hold the host mirrors
        snap = copy.copy(meta)
        snap.kv_indptr = meta.kv_indptr_cpu[: n + 1]
        snap.kv_last_page_len = meta.kv_last_page_len_cpu[:n]
        self.wrappers.proto.plan(  # ok: FC102
            snap.kv_indptr,
            bufs.kv_indices[:nnz],
            snap.kv_last_page_len,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=cfg.kv_dtype,
        )

    def context(self, meta: StepMetadata) -> AttnContext:
        is_extend = meta.qo_indptr is not None
        return AttnContext(
            meta=meta,
            decode_wrapper=None if is_extend else self.wrappers.proto,
            prefill_wrapper=self.wrappers.prefill if is_extend else None,
            is_extend=is_extend,
        )
