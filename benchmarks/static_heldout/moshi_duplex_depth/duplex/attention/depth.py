"""Depth transformer attention.

Within a frame the depth transformer runs ``num_codebooks`` sequential steps; step ``k`` attends to the ``k + 1``
positions written so far in that frame. Each session row owns one depth page (page id = row), so every step is a
decode over a single page whose last-page length is ``k + 1``. Graph-mode decode wrappers are built per bucket and
per step, each bound to its own row of ``depth_last_page_len``. The semantic step (k = 0) sees only the frame's
context token and goes through a ragged self-attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from duplex.settings import DuplexSettings, depth_workspace_bytes

if TYPE_CHECKING:
    from duplex.attention.temporal import TemporalAttnState


class DepthAttnState:
    def __init__(self, settings: DuplexSettings, device: torch.device):
        self.settings = settings
        self.device = device
        self.K = settings.num_codebooks
        self._sm_scale = settings.depth_head_dim ** -0.5  # ok: FC103
        self.workspace = torch.zeros(depth_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        max_bs = max(settings.graph_buckets)
        self.depth_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.depth_indices = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.depth_last_page_len = torch.ones((self.K, max_bs), dtype=torch.int32, device=device)
        self.depth_indptr_host = torch.arange(settings.max_sessions + 1, dtype=torch.int32)
        self.step_ids = torch.arange(max_bs, dtype=torch.int32, device=device)
        caches_shape = (settings.max_sessions, 2, settings.depth_page, settings.depth_heads, settings.depth_head_dim)
        self.caches = [
            torch.zeros(caches_shape, dtype=torch.bfloat16, device=device) for _ in range(settings.depth_layers)
        ]
        self.step_wrappers: Dict[int, List[BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.eager_steps = [BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD") for _ in range(self.K)]
        self.current_steps: List[BatchDecodeWithPagedKVCacheWrapper] = self.eager_steps
        self.semantic_attn: Optional[BatchPrefillWithRaggedKVCacheWrapper] = None

    def init_depth_buffers(self) -> None:
        for k in range(self.K):
            self.depth_last_page_len[k].fill_(k + 1)  # ok: FC104

    def attach_semantic(self, temporal: "TemporalAttnState") -> None:
        # the semantic step is tiny: borrow the temporal eager wrapper's scratch instead of allocating more
        ws = temporal.eager._float_workspace_buffer  # expect: FC103
        self.semantic_attn = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")

    def _plan_kwargs(self) -> dict:
        s = self.settings
        return dict(
            num_qo_heads=s.depth_heads,
            num_kv_heads=s.depth_heads,
            head_dim=s.depth_head_dim,
            page_size=s.depth_page,
            sm_scale=self._sm_scale,
            q_data_type=torch.bfloat16,
        )

    def bind_bucket(self, bs: int) -> List[BatchDecodeWithPagedKVCacheWrapper]:
        wrappers = [
            BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.depth_indptr[: bs + 1],
                paged_kv_indices_buffer=self.depth_indices[:bs],
                paged_kv_last_page_len_buffer=self.depth_last_page_len[k, :bs],
            )
            for k in range(self.K)
        ]
        self.step_wrappers[bs] = wrappers
        self.current_steps = wrappers
        return wrappers

    def plan_codebooks(self, bs: int) -> None:
        if bs > self.step_ids.numel():
            self.step_ids = torch.arange(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        self.depth_indices[:bs].copy_(self.step_ids[:bs])  # ok: FC104
        s = self.settings
        indptr = self.depth_indptr_host[: bs + 1]
        self.semantic_attn.plan(indptr, indptr, s.depth_heads, s.depth_heads, s.depth_head_dim, causal=False)
        wrappers = self.step_wrappers[bs]
        for k in range(1, self.K):
            wrappers[k].plan(indptr, self.depth_indices[:bs], self.depth_last_page_len[k, :bs], **self._plan_kwargs())  # expect: FC102
        self.current_steps = wrappers

    def plan_codebooks_eager(self, bs: int) -> None:
        indptr = self.depth_indptr_host[: bs + 1]
        s = self.settings
        self.semantic_attn.plan(indptr, indptr, s.depth_heads, s.depth_heads, s.depth_head_dim, causal=False)
        indices = torch.arange(bs, dtype=torch.int32, device=self.device)
        for k in range(1, self.K):
            self.eager_steps[k].plan(indptr, indices, torch.full((bs,), k + 1, dtype=torch.int32), **self._plan_kwargs())
        self.current_steps = self.eager_steps

    def mask_delayed_rows(self, rows: torch.Tensor) -> None:
        """Sessions still inside the acoustic delay emit only the semantic codebook: shrink their later steps."""
        self.depth_last_page_len[1:].index_fill_(1, rows, 1)  # expect: FC104
