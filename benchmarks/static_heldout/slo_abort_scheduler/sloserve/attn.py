"""FlashInfer plumbing over persistent decode rows.

Decode: graph-mode decode wrappers per bucket bound to this backend's buffers, an eager wrapper beyond the largest
bucket, and a shared system prompt attended through its own paged wrapper and merged with ``merge_state``.
Prefill: a ragged wrapper over the new tokens and a paged wrapper over the cached prefix of resumed requests; on
Blackwell, long prompts go through trtllm-gen's context kernel instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from sloserve.config import _PREFILL_WORKSPACE, GRAPH_BUCKETS, EngineConfig
from sloserve.scheduler import StepPlan
from sloserve.slots import SlotTable


@dataclass
class PrefillMetadata:
    token_rows: torch.Tensor
    qo_indptr: torch.Tensor
    kv_cu_seqlens: torch.Tensor
    num_tokens: int
    max_q_len: int


class SlotAttnBackend:
    def __init__(self, cfg: EngineConfig, slots: SlotTable, device: torch.device):
        self.cfg = cfg
        self.slots = slots
        self.device = device
        self._backend = "trtllm-gen" if cfg.trtllm_context else "fa2"
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.ctx_workspace = torch.empty_like(self.decode_workspace)  # expect: FC105
        self.prefill_workspace = torch.zeros(_PREFILL_WORKSPACE[cfg.prefill_kernel], dtype=torch.uint8, device=device)  # expect: FC106
        prefix_bytes = max(16 << 20, max(GRAPH_BUCKETS) * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 8)
        self.prefix_workspace = torch.zeros(prefix_bytes, dtype=torch.uint8, device=device)

        max_bs = max(GRAPH_BUCKETS)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_slot, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.null_pages = torch.zeros(max_bs, dtype=torch.int32, device=device)
        # eager prefill: the KV append kernel reads the query offsets on the device
        self.prefill_qo_indptr_gpu = torch.zeros(cfg.max_slots + 1, dtype=torch.int32, device=device)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", backend="fa2")
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.paged_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, "NHD")
        self.system_prefix_pages: Optional[np.ndarray] = None
        self.system_prefix_len = 0
        self.prefill_md: Optional[PrefillMetadata] = None

    def _heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)

    # ------------------------------------------------------------------ shared system prompt
    def set_system_prompt(self, pages: np.ndarray, length: int) -> None:
        self.system_prefix_pages = pages.astype(np.int32)
        self.system_prefix_len = length

    def _plan_system_prefix(self, bs: int) -> None:
        if self.system_prefix_pages is None:
            return
        c = self.cfg
        n = len(self.system_prefix_pages)
        qo = torch.arange(bs + 1, dtype=torch.int32)
        kv_indptr = torch.arange(bs + 1, dtype=torch.int32) * n
        indices = torch.from_numpy(np.tile(self.system_prefix_pages, bs)).to(self.device, non_blocking=True)
        last = torch.full((bs,), (self.system_prefix_len - 1) % c.page_size + 1, dtype=torch.int32)
        self.prefix_wrapper.plan(
            qo, kv_indptr, indices, last, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=False
        )

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            "NHD",
            use_cuda_graph=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs].plan(
            torch.arange(bs + 1, dtype=torch.int32),
            self.null_pages[:bs],
            torch.ones(bs, dtype=torch.int32),
            **self._heads(),
        )
        self._plan_system_prefix(bs)

    def prepare_decode(self, bs: int, step: StepPlan) -> None:
        """Lay out the decode rows of this step (holes and padding included) and plan bucket ``bs``."""
        n = step.num_decode
        if n and int(step.decode_seq_lens_np.max()) >= self.cfg.max_context_len:  # ok: FC101
            raise RuntimeError("a decode row reached max_context_len; the scheduler should have stopped it")
        rows = np.concatenate([step.decode_rows, np.full(bs - n, -1, dtype=np.int32)])
        indptr, indices, last = self.slots.decode_layout(np.maximum(rows, 0))
        self.kv_indptr_host.numpy()[: bs + 1] = indptr
        self.last_page_host.numpy()[:bs] = last
        self.kv_indices[: int(indptr[-1])].copy_(torch.from_numpy(indices), non_blocking=True)  # ok: FC104
        hole_rows = np.flatnonzero(~self.slots.live_np[np.maximum(rows, 0)] | (rows < 0))
        hole_pos = self.kv_indptr_host[torch.from_numpy(hole_rows)].tolist()  # ok: FC101

        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices, self.last_page_host[:bs], **self._heads()
        )
        self._plan_system_prefix(bs)

        if hole_pos:
            # holes and padded rows read (and write their garbage K/V into) the null page
            pos_t = torch.tensor(hole_pos, dtype=torch.int64, device=self.device)
            self.kv_indices.scatter_(0, pos_t, self.null_pages[: len(hole_pos)])  # expect: FC104

    def plan_decode_eager(self, step: StepPlan) -> None:
        indptr, indices, last = self.slots.decode_layout(step.decode_rows)
        self.eager_decode.plan(
            torch.from_numpy(indptr),
            torch.from_numpy(indices).to(self.device, non_blocking=True),
            torch.from_numpy(last),
            **self._heads(),
        )
        self._plan_system_prefix(step.num_decode)

    # ------------------------------------------------------------------ prefill
    def plan_prefill(self, step: StepPlan) -> PrefillMetadata:
        c = self.cfg
        n = len(step.prefill_rows)
        qo_np = step.prefill_qo_indptr_np
        num_tokens = int(qo_np[-1])
        qo_indptr_host = torch.from_numpy(qo_np)
        self.ragged.plan(  # ok: FC102
            qo_indptr_host, qo_indptr_host, c.num_qo_heads, c.num_kv_heads, c.head_dim, causal=True
        )
        rows_t = torch.from_numpy(step.prefill_rows.astype(np.int64)).to(self.device, non_blocking=True)
        prefix_indptr, prefix_indices = self.slots.prefix_layout(step.prefill_rows, step.prefill_prefix_np)
        self.paged_prefill.plan(  # expect: FC102
            qo_indptr_host,
            torch.from_numpy(prefix_indptr),
            torch.from_numpy(prefix_indices).to(self.device, non_blocking=True),
            self.slots.last_page_len_gpu[rows_t],
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            causal=False,
        )
        self.prefill_qo_indptr_gpu[: n + 1].copy_(qo_indptr_host, non_blocking=True)  # ok: FC104
        extend_lens = torch.from_numpy(np.diff(qo_np).astype(np.int64)).to(self.device, non_blocking=True)
        token_rows = torch.repeat_interleave(rows_t, extend_lens, output_size=num_tokens)  # ok: FC101
        kv_cu = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(step.prefill_prefix_np + np.diff(qo_np), out=kv_cu[1:])
        self.prefill_md = PrefillMetadata(
            token_rows=token_rows,
            qo_indptr=self.prefill_qo_indptr_gpu[: n + 1],
            kv_cu_seqlens=torch.from_numpy(kv_cu).to(self.device, non_blocking=True),
            num_tokens=num_tokens,
            max_q_len=int(np.diff(qo_np).max()) if n else 0,
        )
        return self.prefill_md
