"""One wrapper set per layer group, planned per group every step."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from lg_runtime.metadata import (
    GlobalStepMetadata,
    GroupBatch,
    GroupGraphBuffers,
    GroupStepMetadata,
    StepMetadata,
)
from lgroups.kv_pool import GroupKVPool
from lgroups.page_table import build_group_page_table, group_slots, token_rows
from lgroups.spec import ModelGroupsConfig
from lgroups.workspace import graph_workspace


def _pad_rows(last_page_len: torch.Tensor, n: int, bs: int) -> None:
    """Padded rows of a bucket read one token of page 0."""
    last_page_len[n:bs] = 1


class LayerGroupPlanner:
    def __init__(self, cfg: ModelGroupsConfig, pools: List[GroupKVPool], device: torch.device):
        self.cfg = cfg
        self.pools = pools
        self.device = device
        self.specs = [p.spec for p in pools]
        self.local_ids = [g for g, s in enumerate(self.specs) if s.is_local]
        self.global_id = next(g for g, s in enumerate(self.specs) if not s.is_local)
        gspec = self.specs[self.global_id]
        max_bs, max_pages = cfg.max_bs, cfg.max_pages_per_seq
        # eager wrappers of the local groups (FA2)
        self.local_ws = {
            g: torch.empty(cfg.group_workspace_bytes(self.specs[g]), dtype=torch.uint8, device=device)  # ok: FC105
            for g in self.local_ids
        }
        self.group_wrappers: Dict[int, Dict[str, object]] = {
            g: {
                "decode": BatchDecodeWithPagedKVCacheWrapper(self.local_ws[g], pools[g].layout(), use_tensor_cores=True),
                "prefill": BatchPrefillWithPagedKVCacheWrapper(self.local_ws[g], pools[g].layout()),
            }
            for g in self.local_ids
        }
        # the global group: trtllm-gen decode on Blackwell
        self.global_ws = torch.zeros(cfg.group_workspace_bytes(gspec), dtype=torch.uint8, device=device)  # ok: FC105
        gbackend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        layout = pools[self.global_id].layout()
        self.global_decode = BatchDecodeWithPagedKVCacheWrapper(self.global_ws, layout, use_tensor_cores=True, backend=gbackend)
        self.global_prefill = BatchPrefillWithPagedKVCacheWrapper(self.global_ws, layout)
        # eager index staging per group, grown on demand
        self.eager_kv_indices = [
            torch.zeros(max_bs * max_pages, dtype=torch.int32, device=device) for _ in self.specs
        ]
        # graph-bound buffers and pinned mirrors of the local groups
        self.graph_bufs: Dict[int, GroupGraphBuffers] = {
            g: GroupGraphBuffers(
                kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
                kv_indices=torch.zeros(max_bs * max_pages, dtype=torch.int32, device=device),
                kv_last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
            )
            for g in self.local_ids
        }
        self.kv_indptr_host = {g: torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True) for g in self.local_ids}
        self.last_page_host = {g: torch.ones(max_bs, dtype=torch.int32, pin_memory=True) for g in self.local_ids}
        self.graph_slot_mapping = {g: torch.zeros(cfg.max_bs, dtype=torch.int64, device=device) for g in range(len(self.specs))}
        self.graph_ws = {g: graph_workspace(self.specs[g].name, device) for g in self.local_ids}
        self.graph_wrappers: Dict[int, Dict[int, BatchDecodeWithPagedKVCacheWrapper]] = {g: {} for g in self.local_ids}

    def workspace_report(self) -> Dict[str, int]:
        out = {}
        for g, ws in self.group_wrappers.items():
            out[self.specs[g].name] = ws["decode"]._float_workspace_buffer.numel()  # expect: FC103
        out["global"] = self.global_ws.numel()
        return out

    def init_graph_wrappers(self, bs: int) -> None:
        for g in self.local_ids:
            bufs = self.graph_bufs[g]
            bufs.kv_last_page_len.fill_(1)  # ok: FC104
            self.graph_wrappers[g][bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws[g],
                self.pools[g].layout(),
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=bufs.kv_indices,
                paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
            )

    def _head_args(self, g: int) -> dict:
        s = self.specs[g]
        return dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, page_size=s.page_size)

    def plan_step(self, batch: GroupBatch, graph_bs: Optional[int] = None) -> StepMetadata:
        n = batch.num_reqs
        meta = StepMetadata(num_reqs=n)
        for g in self.local_ids:
            spec = self.specs[g]
            pt = build_group_page_table(batch.seq_lens_np, spec.page_size, batch.req_pages[g], spec.window)
            nnz = pt.nnz
            rows = token_rows(batch.q_lens, batch.num_tokens)
            slots = group_slots(batch.block_tables[g], rows, batch.positions, spec.page_size)
            if self.eager_kv_indices[g].numel() < nnz:
                self.eager_kv_indices[g] = torch.empty(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
            indices_np = torch.from_numpy(pt.indices)
            if graph_bs is not None:
                bufs = self.graph_bufs[g]
                w = self.graph_wrappers[g][graph_bs]
                indptr_host = self.kv_indptr_host[g]
                indptr_host[: n + 1].copy_(torch.from_numpy(pt.indptr))
                indptr_host[n + 1 : graph_bs + 1].fill_(nnz)
                self.last_page_host[g][:n].copy_(torch.from_numpy(pt.last_page_len))
                padded_nnz = indptr_host[graph_bs].item()  # ok: FC101
                bufs.kv_indices[:padded_nnz].copy_(indices_np, non_blocking=True)  # ok: FC104
                w.plan(
                    indptr_host[: graph_bs + 1],
                    bufs.kv_indices[:padded_nnz],
                    self.last_page_host[g][:graph_bs],
                    head_dim=spec.head_dim,
                    window_left=spec.window - 1,
                    **self._head_args(g),
                )
            elif batch.is_decode:
                w = self.group_wrappers[g]["decode"]
                idx = self.eager_kv_indices[g][:nnz]
                idx.copy_(indices_np, non_blocking=True)
                last_page_len = (batch.seq_lens - 1) % spec.page_size + 1
                w.plan(  # expect: FC102
                    torch.from_numpy(pt.indptr),
                    idx,
                    last_page_len.int(),
                    head_dim=spec.head_dim,
                    window_left=spec.window - 1,
                    **self._head_args(g),
                )
            else:
                w = self.group_wrappers[g]["prefill"]
                idx = self.eager_kv_indices[g][:nnz]
                idx.copy_(indices_np, non_blocking=True)
                w.plan(  # ok: FC102
                    batch.qo_indptr_cpu,
                    torch.from_numpy(pt.indptr),
                    idx,
                    torch.from_numpy(pt.last_page_len),
                    head_dim_qk=spec.head_dim,
                    causal=True,
                    window_left=spec.window - 1,
                    **self._head_args(g),
                )
            meta.groups[g] = GroupStepMetadata(wrapper=w, slot_mapping=slots, nnz_pages=nnz)
        self._plan_global(batch, meta)
        return meta

    def _plan_global(self, batch: GroupBatch, meta: StepMetadata) -> None:
        g = self.global_id
        spec = self.specs[g]
        pt = build_group_page_table(batch.seq_lens_np, spec.page_size, batch.req_pages[g])
        rows = token_rows(batch.q_lens)
        slots = group_slots(batch.block_tables[g], rows, batch.positions, spec.page_size)
        idx = self.eager_kv_indices[g][: pt.nnz]
        idx.copy_(torch.from_numpy(pt.indices), non_blocking=True)
        if batch.is_decode:
            self.global_decode.plan(  # ok: FC102
                torch.from_numpy(pt.indptr),
                idx,
                torch.from_numpy(pt.last_page_len),
                head_dim=spec.head_dim,
                **self._head_args(g),
            )
            w = self.global_decode
        else:
            prefill_kw = dict(
                qo_indptr=batch.qo_indptr,
                paged_kv_indptr=torch.from_numpy(pt.indptr),
                paged_kv_indices=idx,
                paged_kv_last_page_len=torch.from_numpy(pt.last_page_len),
                head_dim_qk=spec.head_dim,
                causal=True,
                **self._head_args(g),
            )
            self.global_prefill.plan(**prefill_kw)  # expect: FC102
            w = self.global_prefill
        meta.global_meta = GlobalStepMetadata(wrapper=w, slot_mapping=slots)

    def prepare_replay(self, batch: GroupBatch, bs: int) -> StepMetadata:
        meta = self.plan_step(batch, graph_bs=bs)
        n = batch.num_reqs
        for g in self.local_ids:
            _pad_rows(self.graph_bufs[g].kv_last_page_len, n, bs)  # expect: FC104
            self.graph_slot_mapping[g][: batch.num_tokens].copy_(meta.groups[g].slot_mapping)  # ok: FC104
        self.graph_slot_mapping[self.global_id][: batch.num_tokens].copy_(meta.global_meta.slot_mapping)
        return meta
