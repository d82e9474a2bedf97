"""Draft and target decode graphs per bucket, a verify prefill and a draft extend."""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Dict

import flashinfer
import numpy as np
import torch
from flashinfer.decode import fast_decode_plan

from spec_attn.indptr import build_qo_indptr, describe_wrapper
from spec_attn.workspaces import (
    draft_extend_workspace,
    draft_graph_workspace,
    target_graph_workspace,
    verify_workspace,
)
from specroll.config import ModelDims, SpecConfig
from specroll.verify_types import VerifyBatch

logger = logging.getLogger(__name__)

Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper
Prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper


@dataclasses.dataclass
class GraphBufs:
    indptr: torch.Tensor
    indices: torch.Tensor
    last_len: torch.Tensor
    indptr_host: torch.Tensor
    indices_host: torch.Tensor
    last_len_host: torch.Tensor


def alloc_graph_bufs(cfg: SpecConfig, device: torch.device) -> GraphBufs:
    n, p = cfg.max_batch, cfg.max_batch * cfg.max_pages_per_req
    i32 = torch.int32
    return GraphBufs(
        indptr=torch.zeros(n + 1, dtype=i32, device=device),
        indices=torch.zeros(p, dtype=i32, device=device),
        last_len=torch.ones(n, dtype=i32, device=device),
        indptr_host=torch.zeros(n + 1, dtype=i32, pin_memory=True),
        indices_host=torch.zeros(p, dtype=i32, pin_memory=True),
        last_len_host=torch.ones(n, dtype=i32, pin_memory=True),
    )


def make_verify_wrapper(ws: torch.Tensor, backend: str) -> Prefill:
    return Prefill(ws, "NHD", backend=backend)


class SpecAttnBackend:
    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.draft_bufs = alloc_graph_bufs(cfg, device)
        self.target_bufs = alloc_graph_bufs(cfg, device)
        self.draft_ws = draft_graph_workspace(device, long_ctx=cfg.max_context > 8192)
        self.target_ws = target_graph_workspace(cfg, device)
        self.draft_wrappers: Dict[int, Decode] = {}
        self.target_wrappers: Dict[int, Decode] = {}
        self.verify_wrapper = make_verify_wrapper(verify_workspace(cfg, device), backend="trtllm-gen")
        self.draft_extend = Prefill(draft_extend_workspace(cfg, device), "NHD", backend="fa2")
        logger.info("verify runs on %s", describe_wrapper(self.verify_wrapper))
        self.init_graph_wrappers()

    def init_graph_wrappers(self) -> None:
        d, t = self.cfg.draft, self.cfg.target
        for bs in self.cfg.buckets:
            self.draft_wrappers[bs] = Decode(
                self.draft_ws,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=d.num_qo_heads // d.num_kv_heads >= 4,
                paged_kv_indptr_buffer=self.draft_bufs.indptr[: bs + 1],
                paged_kv_indices_buffer=self.draft_bufs.indices,
                paged_kv_last_page_len_buffer=self.draft_bufs.last_len[:bs],
            )
            self.target_wrappers[bs] = Decode(
                self.target_ws,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=t.num_qo_heads // t.num_kv_heads >= 4,
                paged_kv_indptr_buffer=self.target_bufs.indptr[: bs + 1],
                paged_kv_indices_buffer=self.target_bufs.indices,
                paged_kv_last_page_len_buffer=self.target_bufs.last_len[:bs],
            )

    @staticmethod
    def load_tables(bufs: GraphBufs, indptr: np.ndarray, indices: np.ndarray, last: np.ndarray, bs: int) -> None:
        """Fill the pinned mirrors, padding rows up to ``bs`` with empty rows."""
        real = len(last)
        bufs.indptr_host[: real + 1].copy_(torch.from_numpy(indptr))
        bufs.indptr_host[real + 1 : bs + 1] = int(indptr[-1])
        bufs.indices_host[: len(indices)].copy_(torch.from_numpy(indices))
        bufs.last_len_host[:real].copy_(torch.from_numpy(last))
        bufs.last_len_host[real:bs] = 1

    def _dims_kwargs(self, dims: ModelDims) -> dict:
        return dict(
            num_qo_heads=dims.num_qo_heads,
            num_kv_heads=dims.num_kv_heads,
            head_dim=dims.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- replay preparation -----------------------------------------------------

    def prepare_draft_graph(self, bs: int, real_bs: int) -> None:
        bufs = self.draft_bufs
        nnz = int(bufs.indptr_host[bs])
        w = self.draft_wrappers[bs]
        w.plan(  # ok: FC102
            bufs.indptr_host[: bs + 1],
            bufs.indices_host[:nnz],
            bufs.last_len_host[:bs],
            **self._dims_kwargs(self.cfg.draft),
        )
        pad = bs - real_bs
        if pad:
            # padding rows read page 0
            bufs.indices[nnz : nnz + pad].zero_()  # expect: FC104

    def prepare_target_graph(self, bs: int) -> None:
        bufs = self.target_bufs
        bufs.last_len[:bs].copy_(bufs.last_len_host[:bs], non_blocking=True)  # ok: FC104
        nnz = int(bufs.indptr_host[bs])
        plan = functools.partial(fast_decode_plan, self.target_wrappers[bs])
        plan(  # expect: FC102
            indptr=bufs.indptr_host[: bs + 1],
            indices=bufs.indices_host[:nnz],
            last_page_len=bufs.last_len[:bs],
            **self._dims_kwargs(self.cfg.target),
        )

    def plan_verify(self, vb: VerifyBatch) -> None:
        total = vb.num_draft_tokens
        if total == 0:
            return
        qo_indptr = build_qo_indptr(vb.draft_lens)
        t = self.cfg.target
        self.verify_wrapper.plan(  # expect: FC102
            qo_indptr,
            vb.kv_indptr_cpu,
            vb.kv_indices_cpu,
            vb.last_len_cpu,
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )
        # per-step positions of the verified tokens, filled by the target model
        vb.positions = torch.empty(total, dtype=torch.long, device=self.device)  # ok: FC107

    def plan_draft_extend(self, qo_indptr_cpu: torch.Tensor, indptr_cpu: torch.Tensor,
                          indices_cpu: torch.Tensor, last_cpu: torch.Tensor) -> None:
        d = self.cfg.draft
        self.draft_extend.plan(  # ok: FC102
            qo_indptr_cpu, indptr_cpu, indices_cpu, last_cpu,
            d.num_qo_heads, d.num_kv_heads, d.head_dim, self.cfg.page_size,
            causal=True, q_data_type=torch.bfloat16,
        )

    def plan_for_capture(self, bs: int) -> None:
        ones = np.ones(bs, dtype=np.int32)
        indptr = np.arange(bs + 1, dtype=np.int32)
        for bufs in (self.draft_bufs, self.target_bufs):
            self.load_tables(bufs, indptr, np.zeros(bs, dtype=np.int32), ones, bs)
        self.draft_wrappers[bs].plan(
            self.draft_bufs.indptr_host[: bs + 1], self.draft_bufs.indices_host[:bs],
            self.draft_bufs.last_len_host[:bs], **self._dims_kwargs(self.cfg.draft),
        )
        self.target_wrappers[bs].plan(
            self.target_bufs.indptr_host[: bs + 1], self.target_bufs.indices_host[:bs],
            self.target_bufs.last_len_host[:bs], **self._dims_kwargs(self.cfg.target),
        )
        k1 = self.cfg.num_draft_tokens + 1
        t = self.cfg.target
        self.verify_wrapper.plan(
            torch.arange(0, (bs + 1) * k1, k1, dtype=torch.int32),
            self.target_bufs.indptr_host[: bs + 1], self.target_bufs.indices_host[:bs],
            self.target_bufs.last_len_host[:bs],
            t.num_qo_heads, t.num_kv_heads, t.head_dim, self.cfg.page_size,
            causal=True, q_data_type=torch.bfloat16,
        )

    # ---- attention (handed to the models) ---------------------------------------

    def draft_attention(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        return self.draft_wrappers[bs].run(q, kv)  # ok: FC108

    def target_attention(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        return self.target_wrappers[bs].run(q, kv)

    def verify_attention(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        # k + 1 query tokens per row over the paged KV
        return self.verify_wrapper.run(q, kv)  # expect: FC108

    def draft_extend_attention(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        return self.draft_extend.run(q, kv)
