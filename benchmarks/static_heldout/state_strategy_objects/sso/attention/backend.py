"""FlashInfer resources shared by every attention strategy: workspaces, wrappers, graph-bound buffers."""

from __future__ import annotations

import logging

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from sso.config import DEFAULT_WORKSPACE_BYTES, EngineConfig

logger = logging.getLogger(__name__)


class FlashInferBackend:
    """Owns what outlives a strategy swap; strategies borrow wrappers and buffers from here."""

    kv_layout = "NHD"

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_num_seqs

        self.workspace_buffer = torch.zeros(DEFAULT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        # prefill runs on FA2, whose workspace needs no zeroing; sized from the token budget
        self.prefill_workspace = torch.empty(  # ok: FC105, FC106
            cfg.max_num_tokens * cfg.num_qo_heads * cfg.head_dim * 4, dtype=torch.uint8, device=device
        )
        self.cascade_workspace = torch.zeros(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        # not a workspace: a fixed scratch row for the sampler's top-k pass
        self.logits_scratch = torch.zeros(4096, dtype=torch.float32, device=device)  # ok: FC106

        # eager buffers: no wrapper keeps them, plan() gets the pinned mirrors
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, self.kv_layout)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self.prefill_workspace, self.kv_layout, backend="fa2"
        )
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(
            self.prefill_workspace, self.kv_layout, backend="fa2"
        )

        self.graph_decode_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.cuda_graph_kv_indptr = None
        self.cuda_graph_kv_indices = None
        self.cuda_graph_last_page_len = None

    # ------------------------------------------------------------------ graph state
    def init_cuda_graph_state(self, sizes: list[int]) -> None:
        max_bs = max(sizes)
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(self.cfg.max_pages, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104
        for bs in sizes:
            self.graph_decode_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer,
                self.kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
            )
        logger.info("graph decode wrappers for %d sizes", len(sizes))

    def plan_kwargs(self) -> dict:
        cfg = self.cfg
        return dict(
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
        )

    def reset_eager_buffers(self, bs: int) -> None:
        # eager decode keeps its own device copy for the sampler's gather; no wrapper binds it
        self.kv_indptr[: bs + 1].zero_()  # ok: FC104
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
