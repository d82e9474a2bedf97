"""FlashInfer backend for mixture-of-spans attention: one set of wrappers per head group.

Decode: local groups run a decode wrapper planned with ``window_left`` over window-trimmed
page lists; the global group runs a split-KV tensor-core wrapper over the whole context
(optionally on trtllm-gen).  Extend: one paged prefill wrapper per group.  CUDA graphs: one
dict of graph-mode wrappers per bucket, bound to ``GroupGraphBuffers`` of each local group."""

from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from span_srt.forward_batch import ForwardBatch
from span_srt.metadata import GroupGraphBuffers, GroupMetadata, SpanForwardMetadata
from spanattn.paging import window_page_lists
from spanattn.pool import SpanKVPool
from spanattn.spans import SpanConfig, window_first_pos

# tiers picked when the model was brought up on 8k prompts
_WS_TIERS = {"prefill": 512 * 1024 * 1024, "decode": 128 * 1024 * 1024}


class MixedSpanAttnBackend:
    def __init__(self, cfg: SpanConfig, pools: List[SpanKVPool], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.pools = pools
        self.groups = cfg.groups
        self.page_size = cfg.page_size
        self.head_dim = cfg.head_dim
        self.ratio = cfg.gqa_ratio
        self.global_group_id = next(i for i, g in enumerate(self.groups) if g.is_global)
        self.local_group_ids = [i for i, g in enumerate(self.groups) if not g.is_global]

        self.prefill_workspace = self._alloc_workspace("prefill")
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.graph_workspace = torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        global_ws = torch.empty(cfg.global_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        global_ws.zero_()
        self.global_workspace = global_ws

        self.eager_local: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for g in self.local_group_ids:
            layout = self.pools[g]._kv_layout  # ok: FC103
            self.eager_local[g] = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, layout, use_tensor_cores=True)
        self.global_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.global_workspace,
            self.pools[self.global_group_id].kv_layout,
            use_tensor_cores=True,
            backend="trtllm-gen" if cfg.global_trtllm else "fa2",
        )
        self.prefill_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {
            g: BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self.pools[g].kv_layout)
            for g in range(len(self.groups))
        }

        self.graph_bufs: Dict[int, GroupGraphBuffers] = {}
        self.graph_local: Dict[int, Dict[int, BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.eager_indices: Optional[torch.Tensor] = None
        self.last_seq_lens_cpu: Optional[torch.Tensor] = None
        self.capture_indptr_cpu = torch.arange(cfg.max_graph_bs + 1, dtype=torch.int32)
        self.capture_last_cpu = torch.ones(cfg.max_graph_bs, dtype=torch.int32)
        self.capture_indices = torch.zeros(cfg.max_graph_bs, dtype=torch.int32, device=device)

    def _alloc_workspace(self, kind: str) -> torch.Tensor:
        return torch.zeros(_WS_TIERS[kind], dtype=torch.uint8, device=self.device)  # expect: FC106

    def _heads(self, g: int):
        kv = self.groups[g].num_kv_heads
        return kv * self.ratio, kv

    # ------------------------------------------------------------------ graph set-up
    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_bufs = {
            g: GroupGraphBuffers.allocate(max_bs, self.cfg.max_pages_for(self.groups[g]), self.device)
            for g in self.local_group_ids
        }
        for gb in self.graph_bufs.values():
            gb.last_page_len.fill_(1)  # ok: FC104

    # ------------------------------------------------------------------ helpers
    def _build_group_md(
        self, g: int, slots_np: np.ndarray, seq_np: np.ndarray, extend_np: Optional[np.ndarray] = None
    ) -> GroupMetadata:
        grp = self.groups[g]
        indptr_np, indices_np, last_np, first_np = window_page_lists(
            seq_np, self.pools[g].block_table_np, slots_np, grp.window, self.page_size, extend_np
        )
        return GroupMetadata(
            kv_indptr=torch.from_numpy(indptr_np).to(self.device, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(indptr_np),
            last_page_len_cpu=torch.from_numpy(last_np),
            indices_np=indices_np,
            first_page_np=first_np,
        )

    def _stage_indices(self, mds: List[GroupMetadata]) -> None:
        need = sum(md.indices_np.shape[0] for md in mds)
        if self.eager_indices is None or self.eager_indices.numel() < need:
            self.eager_indices = torch.empty(2 * need, dtype=torch.int32, device=self.device)  # expect: FC107
        off = 0
        for md in mds:
            n = md.indices_np.shape[0]
            md.kv_indices = self.eager_indices[off : off + n]
            md.kv_indices.copy_(torch.from_numpy(md.indices_np), non_blocking=True)
            off += n

    def _reclaim_slid_pages(self, fb: ForwardBatch) -> None:
        """Local groups: once a row's window start moves onto a page boundary, the page before
        it can go back to the group's pool."""
        for g in self.local_group_ids:
            start = window_first_pos(fb.seq_lens, self.groups[g].window)
            crossed = (start % self.page_size == 0) & (start > 0)
            rows = torch.nonzero(crossed).squeeze(1).cpu()  # expect: FC101
            slots_np = fb.req_slots_cpu.numpy()
            for r in rows.numpy():
                first = (int(fb.seq_lens_cpu[r]) - self.groups[g].window) // self.page_size
                self.pools[g].release_before(int(slots_np[r]), first)

    def _plan_global(self, md: GroupMetadata) -> None:
        qo, kv = self._heads(self.global_group_id)
        self.global_decode.plan(
            md.kv_indptr_cpu,
            md.kv_indices,
            md.last_page_len_cpu,
            qo,
            kv,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ per step
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        longest = int(fb.seq_lens_cpu.max())  # ok: FC101
        if longest > self.cfg.max_context:
            raise ValueError(f"sequence of {longest} tokens exceeds max_context={self.cfg.max_context}")
        self.last_seq_lens_cpu = fb.seq_lens_cpu.clone()  # ok: FC107
        slots_np = fb.req_slots_cpu.numpy()
        seq_np = fb.seq_lens_cpu.numpy()

        if fb.forward_mode.is_decode():
            self._reclaim_slid_pages(fb)
            mds = [self._build_group_md(g, slots_np, seq_np) for g in range(len(self.groups))]
            self._stage_indices(mds)
            for g in self.local_group_ids:
                md = mds[g]
                qo, kv = self._heads(g)
                self.eager_local[g].plan(  # expect: FC102
                    md.kv_indptr,
                    md.kv_indices,
                    md.last_page_len_cpu,
                    qo,
                    kv,
                    self.head_dim,
                    self.page_size,
                    window_left=self.groups[g].window - 1,
                    q_data_type=torch.bfloat16,
                )
            self._plan_global(mds[self.global_group_id])
            fb.attn_meta = SpanForwardMetadata(
                groups=mds,
                local_wrappers=self.eager_local,
                global_wrapper=self.global_decode,
                prefill_wrappers={},
            )
            return

        extend_np = fb.extend_lens_cpu.numpy()
        mds = [self._build_group_md(g, slots_np, seq_np, extend_np) for g in range(len(self.groups))]
        self._stage_indices(mds)
        qo_indptr_cpu = fb.extend_qo_indptr_cpu
        for g, grp in enumerate(self.groups):
            md = mds[g]
            qo, kv = self._heads(g)
            plan_fn = functools.partial(
                self.prefill_wrappers[g].plan,
                num_qo_heads=qo,
                num_kv_heads=kv,
                head_dim_qk=self.head_dim,
                page_size=self.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
            if grp.is_global:
                plan_fn(qo_indptr_cpu, md.kv_indptr_cpu, md.kv_indices, md.last_page_len_cpu)  # ok: FC102
            else:
                # same queries, window-trimmed pages
                plan_fn(fb.extend_qo_indptr, md.kv_indptr_cpu, md.kv_indices, md.last_page_len_cpu, window_left=grp.window - 1)  # expect: FC102
        fb.attn_meta = SpanForwardMetadata(
            groups=mds, local_wrappers={}, global_wrapper=None, prefill_wrappers=self.prefill_wrappers
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for g in self.local_group_ids:
            gb = self.graph_bufs[g]
            wrappers[g] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.pools[g].kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=gb.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=gb.kv_indices,
                paged_kv_last_page_len_buffer=gb.last_page_len[:bs],
            )
            qo, kv = self._heads(g)
            wrappers[g].plan(
                self.capture_indptr_cpu[: bs + 1],
                gb.kv_indices[:bs],
                self.capture_last_cpu[:bs],
                qo,
                kv,
                self.head_dim,
                self.page_size,
                window_left=self.groups[g].window - 1,
                q_data_type=torch.bfloat16,
            )
        self.graph_local[bs] = wrappers
        qo, kv = self._heads(self.global_group_id)
        self.global_decode.plan(
            self.capture_indptr_cpu[: bs + 1],
            self.capture_indices[:bs],
            self.capture_last_cpu[:bs],
            qo,
            kv,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        fb.attn_meta = SpanForwardMetadata(
            groups=[], local_wrappers=wrappers, global_wrapper=self.global_decode, prefill_wrappers={}
        )

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        req_slots_cpu: torch.Tensor,
    ) -> None:
        # guard the indices buffers: the widest span decides how many pages a row touches
        span_pages = math.ceil(seq_lens.max() / self.page_size)  # expect: FC101
        if span_pages > self.cfg.max_pages_per_req:
            raise ValueError(f"{span_pages} pages per row exceed the page table width")
        seq_np = seq_lens_cpu.numpy()
        slots_np = req_slots_cpu.numpy()
        wrappers = self.graph_local[bs]
        for g in self.local_group_ids:
            gb = self.graph_bufs[g]
            indptr_np, indices_np, last_np, _ = window_page_lists(
                seq_np, self.pools[g].block_table_np, slots_np, self.groups[g].window, self.page_size
            )
            n_idx = indices_np.shape[0]
            cap = wrappers[g]._paged_kv_indices_buf.numel()  # expect: FC103
            if n_idx > cap:
                raise RuntimeError(f"group {g}: {n_idx} page ids do not fit the graph buffer of {cap}")
            gb.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(indptr_np))
            gb.last_page_len_cpu[:bs].copy_(torch.from_numpy(last_np))
            gb.kv_indices[:n_idx].copy_(torch.from_numpy(indices_np), non_blocking=True)  # ok: FC104
            qo, kv = self._heads(g)
            wrappers[g].plan(  # ok: FC102
                gb.kv_indptr_cpu[: bs + 1],
                gb.kv_indices[:n_idx],
                gb.last_page_len_cpu[:bs],
                qo,
                kv,
                self.head_dim,
                self.page_size,
                window_left=self.groups[g].window - 1,
                q_data_type=torch.bfloat16,
            )
            gb.last_page_len_cpu[bs:].fill_(1)  # ok: FC104
        gm = self._build_group_md(self.global_group_id, slots_np, seq_np)
        gm.kv_indices = torch.empty(gm.indices_np.shape[0], dtype=torch.int32, device=self.device)  # ok: FC107
        gm.kv_indices.copy_(torch.from_numpy(gm.indices_np), non_blocking=True)
        self._plan_global(gm)
        # a row that just filled its last page reports 0 from the window arithmetic
        for g in self.local_group_ids:
            self.graph_bufs[g].last_page_len[:bs].clamp_(min=1)  # expect: FC104
