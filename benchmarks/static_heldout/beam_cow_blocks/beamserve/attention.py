"""FlashInfer attention over the beams' block tables.

Every beam attends to (a) the full prompt blocks its request shares with its sibling beams and (b) its own
suffix blocks. (a) is one non-causal prefill pass per request (all beams of the request are its queries),
(b) a decode pass over the suffix tables; the two partial results are merged by log-sum-exp. Beam batches up
to the largest bucket replay a CUDA graph over graph-mode decode wrappers; larger ones run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    merge_state_in_place,
)

from beamserve.blocks import BeamLayout
from beamserve.config import BeamConfig


@dataclass
class BeamBuffers:
    """Scratch shared by every beam-bucket graph."""

    workspace: torch.Tensor = field(default_factory=lambda: torch.zeros(96 * 1024 * 1024, dtype=torch.uint8, device="cuda"))  # expect: FC106


@dataclass
class BeamBatch:
    layout: BeamLayout
    beam_tokens: torch.Tensor
    beam_positions: torch.Tensor

    @property
    def num_beams(self) -> int:
        return self.layout.num_beams

    @property
    def layout_changed(self) -> bool:
        return self.layout.changed


class BeamDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """A decode wrapper that also knows how its pages are laid out."""

    def page_view(self, kv_cache: torch.Tensor) -> torch.Tensor:
        if self._kv_layout == "NHD":  # expect: FC103
            return kv_cache
        return kv_cache.transpose(-3, -2)


class BeamDecodeBackend:
    def __init__(self, cfg: BeamConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_beams = cfg.max_beams_per_step
        self.buffers = BeamBuffers()
        self.eager_workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefix_workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)
        self.indptr_cpu = torch.zeros(max_beams + 1, dtype=torch.int32, pin_memory=True)
        self.last_cpu = torch.ones(max_beams, dtype=torch.int32, pin_memory=True)
        self.beam_num_blocks = torch.zeros(max_beams, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(max_beams, dtype=torch.int64, device=device)
        self.prefix_out: Optional[torch.Tensor] = None

        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, cfg.kv_layout, backend="fa2")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, cfg.kv_layout)
        self.graph_wrappers: Dict[int, BeamDecodeWrapper] = {}
        self.graph_bufs: Dict[int, Dict[str, torch.Tensor]] = {}
        self.planned_indices: Dict[int, int] = {}
        for bs in cfg.graph_beam_buckets:
            self._make_graph_wrapper(bs)

    def _make_graph_wrapper(self, bs: int) -> BeamDecodeWrapper:
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        indices = torch.zeros(bs * self.cfg.max_blocks_per_beam, dtype=torch.int32, device=self.device)
        last = torch.empty(bs, dtype=torch.int32, device=self.device)
        last.fill_(1)  # ok: FC104
        wrapper = BeamDecodeWrapper(
            self.buffers.workspace,
            self.cfg.kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last,
        )
        self.graph_bufs[bs] = {"indptr": indptr, "indices": indices, "last": last}
        self.graph_wrappers[bs] = wrapper
        return wrapper

    def _head_args(self) -> Tuple[int, int, int, int]:
        return self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.block_size

    def _prefix_kwargs(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim,
                    page_size=c.block_size, causal=False, q_data_type=c.dtype)

    def _plan_prefix(self, layout: BeamLayout) -> None:
        if self.prefix_out is None:
            self.prefix_out = torch.empty(  # ok: FC107
                self.cfg.max_beams_per_step, self.cfg.num_qo_heads, self.cfg.head_dim,
                dtype=self.cfg.dtype, device=self.device,
            )
        self.prefix_wrapper.plan(  # ok: FC102
            qo_indptr=torch.from_numpy(layout.prefix_qo_indptr_np),
            paged_kv_indptr=torch.from_numpy(layout.prefix_kv_indptr_np),
            paged_kv_indices=torch.from_numpy(layout.prefix_kv_indices_np).to(self.device, non_blocking=True),
            paged_kv_last_page_len=torch.from_numpy(layout.prefix_last_np),
            **self._prefix_kwargs(),
        )

    def warm_graph_plan(self, bs: int) -> None:
        """One block per beam, all beams of one request, before the bucket is captured."""
        self.indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.last_cpu[:bs].fill_(1)
        self.graph_wrappers[bs].plan(
            self.indptr_cpu[: bs + 1],
            self.graph_bufs[bs]["indices"][:bs],
            self.last_cpu[:bs],
            *self._head_args(),
            q_data_type=self.cfg.dtype,
        )
        self.prefix_wrapper.plan(
            qo_indptr=torch.tensor([0, bs], dtype=torch.int32),
            paged_kv_indptr=torch.tensor([0, 1], dtype=torch.int32),
            paged_kv_indices=torch.zeros(1, dtype=torch.int32, device=self.device),
            paged_kv_last_page_len=torch.tensor([self.cfg.block_size], dtype=torch.int32),
            **self._prefix_kwargs(),
        )

    def plan_beam_decode(self, batch: BeamBatch, padded: int) -> None:
        layout = batch.layout
        n, n_idx = layout.num_beams, len(layout.suffix_indices_np)
        bufs = self.graph_bufs[padded]
        self.indptr_cpu[: n + 1].copy_(torch.from_numpy(layout.suffix_indptr_np))
        self.indptr_cpu[n + 1 : padded + 1] = n_idx
        self.last_cpu[:n].copy_(torch.from_numpy(layout.suffix_last_np))
        self.last_cpu[n:padded] = 1
        bufs["indices"][:n_idx].copy_(torch.from_numpy(layout.suffix_indices_np).to(self.device, non_blocking=True))  # ok: FC104
        self.slot_mapping[:n].copy_(torch.from_numpy(layout.slot_mapping_np), non_blocking=True)
        self.graph_wrappers[padded].plan(  # ok: FC102
            self.indptr_cpu[: padded + 1],
            bufs["indices"][:n_idx],
            self.last_cpu[:padded],
            *self._head_args(),
            q_data_type=self.cfg.dtype,
        )
        self.planned_indices[padded] = n_idx
        self._plan_prefix(layout)

    def plan_eager_beams(self, batch: BeamBatch) -> None:
        layout = batch.layout
        n = layout.num_beams
        kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(self.beam_num_blocks[:n], dim=0, out=kv_indptr[1:])
        self.slot_mapping[:n].copy_(torch.from_numpy(layout.slot_mapping_np), non_blocking=True)
        self.eager_wrapper.plan(  # expect: FC102
            kv_indptr,
            torch.from_numpy(layout.suffix_indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(layout.suffix_last_np),
            *self._head_args(),
            q_data_type=self.cfg.dtype,
        )
        self._plan_prefix(layout)

    def store_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int) -> None:
        # kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_dim]
        flat = kv_cache.transpose(0, 1).flatten(1, 2)
        slots = self.slot_mapping[:n]
        flat[0].index_copy_(0, slots, k)
        flat[1].index_copy_(0, slots, v)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, padded: int):
        wrapper = self.graph_wrappers[padded]
        return wrapper.run(q, wrapper.page_view(kv_cache), return_lse=True)  # ok: FC108

    def forward_decode_eager(self, q: torch.Tensor, kv_cache: torch.Tensor):
        return self.eager_wrapper.run(q, kv_cache, return_lse=True)

    def forward_prefix(self, q: torch.Tensor, kv_cache: torch.Tensor):
        out = self.prefix_out[: q.shape[0]] if self.prefix_out is not None else None
        return self.prefix_wrapper.run(q, kv_cache, out=out, return_lse=True)  # expect: FC108

    def merge(self, o_sfx: torch.Tensor, lse_sfx: torch.Tensor, o_pfx: torch.Tensor, lse_pfx: torch.Tensor):
        merge_state_in_place(o_sfx, lse_sfx, o_pfx, lse_pfx)
        return o_sfx
