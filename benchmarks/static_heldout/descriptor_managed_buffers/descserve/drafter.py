"""A one-step EAGLE-style drafter over the target model's KV cache.

The drafter stages its page table with the very descriptor objects the attention backends
declare (``kv_indptr = KV_INDPTR`` ...), so that the staging code reads the same in both
places.  Each drafter owns its storage; none of it is bound to a graph-mode wrapper.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from torch import nn

from descserve_kernels.paged_ops import PagedKVPool, build_kv_indices
from descserve_kernels.trtllm_decode import ScratchPool, draft_decode, draft_extend

from .attn_base import KV_INDPTR, KV_INDPTR_CPU, KV_INDPTR_NP, LAST_PAGE_LEN_CPU, LAST_PAGE_LEN_NP, AttnBackendBase
from .config import EngineConfig
from .descriptors import DeviceBuffer
from .forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class EagleDrafter:
    kv_indptr = KV_INDPTR
    kv_indptr_cpu = KV_INDPTR_CPU
    kv_indptr_np = KV_INDPTR_NP
    last_page_len_cpu = LAST_PAGE_LEN_CPU
    last_page_len_np = LAST_PAGE_LEN_NP

    draft_kv_indices = DeviceBuffer(lambda o: o.max_bs * o.max_pages_per_req)
    last_draft = DeviceBuffer(lambda o: o.max_bs, torch.int64)
    hidden = DeviceBuffer(lambda o: (o.max_bs, o.hidden_size), torch.bfloat16)
    # Sized for the captured batches; an eager batch above them grows it.
    block_tables = DeviceBuffer(lambda o: (o.graph_max_bs, o.max_pages_per_req))

    _plan_info: Optional[Tuple[int, int]] = None

    def __init__(
        self,
        cfg: EngineConfig,
        target: AttnBackendBase,
        kv_pool: PagedKVPool,
        req_to_page: torch.Tensor,
        device: torch.device,
    ) -> None:
        self.cfg = cfg
        self.target = target
        self.kv_pool = kv_pool
        self.req_to_page = req_to_page
        self.device = torch.device(device)
        self.max_bs = target.max_bs
        self.graph_max_bs = max(cfg.cuda_graph_max_bs, 1)
        self.max_pages_per_req = target.max_pages_per_req
        self.hidden_size = cfg.hidden_size
        self.page_size = cfg.page_size
        self.num_steps = cfg.speculative_num_steps
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.max_context_len = cfg.max_context_len
        self.scaling = cfg.head_dim**-0.5
        self.attention = cfg.draft_attention_backend
        self.miss_streak = 0
        self._draft_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._draft_ws: Optional[torch.Tensor] = None
        self.extend_workspace = torch.empty(cfg.draft_extend_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.extend_workspace, target.kv_layout, backend="fa2")
        self.scratch = ScratchPool(self.device)
        dt = torch.bfloat16
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=self.device, dtype=dt)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False, device=self.device, dtype=dt)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False, device=self.device, dtype=dt)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=self.device, dtype=dt)

    # -- lazily built pieces ---------------------------------------------------------------

    @property
    def draft_workspace(self) -> torch.Tensor:
        if self._draft_ws is None:
            self._draft_ws = torch.zeros(int(os.getenv("DESC_DRAFT_WS_MB", "64")) << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        return self._draft_ws

    @property
    def draft_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        if self._draft_wrapper is None:
            self._draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_workspace, self.target.kv_layout, backend="fa2")
        return self._draft_wrapper

    @property
    def target_kv_indices(self) -> torch.Tensor:
        """The target backend's page indices (bound to its decode graph wrappers)."""
        return self.target.kv_indices

    # -- every step -------------------------------------------------------------------------

    def propose(self, fb: ForwardBatch, logits: torch.Tensor, next_ids: torch.Tensor, drafted: bool) -> None:
        bs = fb.batch_size
        accepted = next_ids[:bs] == self.last_draft[:bs]
        if not accepted.any():  # expect: FC101
            self.miss_streak += 1
        else:
            self.miss_streak = 0

        # Draft pages: each request grows by num_steps tokens.  Host lengths only.
        lens = np.asarray(fb.seq_lens_cpu[:bs].tolist(), dtype=np.int64)
        ps = self.page_size
        self.kv_indptr_np[0] = 0
        np.cumsum((lens + self.num_steps + ps - 1) // ps, out=self.kv_indptr_np[1 : bs + 1])
        self.last_page_len_np[:bs] = (lens + self.num_steps - 1) % ps + 1
        total = int(self.kv_indptr_np[bs])
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        build_kv_indices(self.req_to_page, fb.req_pool_indices, self.kv_indptr, self.draft_kv_indices, total)

        # Verification reads the draft pages right after the target's own rows.
        start = int(self.target.kv_indptr_cpu[bs])  # ok: FC101
        if start + total <= self.target_kv_indices.numel():
            self.target_kv_indices[start : start + total] = self.draft_kv_indices[:total]  # expect: FC104

        if self.attention == "fa2":
            key = (bs, total)
            if self._plan_info != key:  # ok: FC103
                self.draft_wrapper.plan(  # expect: FC102
                    self.kv_indptr[: bs + 1],
                    self.draft_kv_indices[:total],
                    self.last_page_len_cpu[:bs],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    self.page_size,
                    q_data_type=torch.bfloat16,
                )
                self._plan_info = key
        else:
            if bs > self.block_tables.shape[0]:
                type(self).block_tables.grow(self, bs)
            self.block_tables[:bs] = self.req_to_page[fb.req_pool_indices]

        if fb.forward_mode.is_extend():
            self._draft_prefill(fb, bs, total)
        if not drafted:
            self.draft_forward(fb, logits)

    def _draft_prefill(self, fb: ForwardBatch, bs: int, total: int) -> None:
        """Run the draft head over the prompt tokens of a prefill step."""
        h = self.embed(fb.input_ids)
        q = self.q_proj(h).view(-1, self.num_qo_heads, self.head_dim)
        kv = self.kv_pool.get_kv_buffer(self.cfg.num_layers - 1)
        if self.attention == "fa2":
            self.extend_wrapper.plan(  # ok: FC102
                fb.qo_indptr_cpu,
                self.kv_indptr_cpu[: bs + 1],
                self.draft_kv_indices[:total],
                self.last_page_len_cpu[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
            self.extend_wrapper.run(q, kv)
            return
        draft_extend(
            q,
            kv,
            self.scratch,
            self.block_tables[:bs],
            fb.seq_lens,
            fb.qo_indptr,
            F.pad(torch.cumsum(fb.seq_lens, 0, dtype=torch.int32), (1, 0)),
            fb.max_extend_len,
            int(fb.seq_lens_cpu.max()),
            self.scaling,
        )

    # -- captured together with the target's decode graph -----------------------------------

    def draft_forward(self, fb: ForwardBatch, logits: torch.Tensor) -> None:
        bs = fb.batch_size
        tok = logits[:bs].argmax(dim=-1)
        h = self.hidden[:bs]
        h.copy_(self.embed(tok))
        q = self.q_proj(h).view(bs, self.num_qo_heads, self.head_dim)
        kv = self.kv_pool.get_kv_buffer(self.cfg.num_layers - 1)
        if self.attention == "fa2":
            o = self.draft_wrapper.run(q, kv)  # expect: FC108
        else:
            o = draft_decode(q, kv, self.scratch, self.block_tables[:bs], fb.seq_lens, self.max_context_len, self.scaling)
        draft = self.lm_head(self.o_proj(o.reshape(bs, -1))).argmax(dim=-1)
        self.last_draft[:bs].copy_(draft)
