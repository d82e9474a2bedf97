"""Attention of hybrid sliding-window / global models: one wrapper per layer group, graph wrappers per batch size."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

GROUPS = ("swa", "full")
# scratch of the eager wrappers, per group
_WS_BYTES = {"swa": 64 << 20, "full": 256 << 20}


@dataclass
class StepBatch:
    num_decodes: int
    num_prefills: int
    input_ids_cpu: torch.Tensor
    # per group: page ids and last-page length of every request, decodes first (host)
    kv_pages: Dict[str, List[List[int]]]
    last_page_lens: Dict[str, List[int]]
    qo_indptr_cpu: torch.Tensor
    qo_indptr_gpu: torch.Tensor


class HybridAttnBackend:
    # the global layers decode with the trtllm-gen kernels, the windowed ones with FA2
    decode_backend = {"swa": "fa2", "full": "trtllm-gen"}

    def __init__(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, windows: Dict[str, int],
                 max_bs: int, max_pages: int, max_num_tokens: int, device):
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.windows = windows
        self.device = device
        self._backend = "flashinfer"  # ok: FC103
        self.kv_indptr = [torch.zeros(max_bs + 1, dtype=torch.int32, device=device) for _ in GROUPS]
        self.kv_indptr_host = [torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True) for _ in GROUPS]
        self.kv_indices = [torch.zeros(max_pages, dtype=torch.int32, device=device) for _ in GROUPS]
        self.kv_last_page_len = [torch.ones(max_bs, dtype=torch.int32, device=device) for _ in GROUPS]
        self.kv_last_page_len_host = [torch.ones(max_bs, dtype=torch.int32, pin_memory=True) for _ in GROUPS]
        self.prefill_kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.prefill_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.prefill_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        partial_bytes = max_num_tokens * num_qo_heads * head_dim * 4
        self.workspaces = {g: torch.empty(partial_bytes, dtype=torch.uint8, device=device) for g in GROUPS}  # expect: FC105  # ok: FC106
        self.eager_workspace = torch.zeros(_WS_BYTES["full"], dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
        self.wrappers: Dict[str, list] = {
            "decode": [
                BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "HND", backend=self.decode_backend[g])
                for g in GROUPS
            ],
            "prefill": [BatchPrefillWithPagedKVCacheWrapper(self.eager_workspace, "HND") for _ in GROUPS],
        }
        self.graph_wrappers: Dict[int, List[BatchDecodeWithPagedKVCacheWrapper]] = {}

    def init_graph_wrappers(self, bs: int) -> List[BatchDecodeWithPagedKVCacheWrapper]:
        group_wrappers = []
        for g, name in enumerate(GROUPS):
            group_wrappers.append(
                BatchDecodeWithPagedKVCacheWrapper(
                    self.workspaces[name],
                    "HND",
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.kv_indptr[g][: bs + 1],
                    paged_kv_indices_buffer=self.kv_indices[g],
                    paged_kv_last_page_len_buffer=self.kv_last_page_len[g][:bs],
                    backend=self.decode_backend[name],
                )
            )
        self.graph_wrappers[bs] = group_wrappers
        return group_wrappers

    def set_softmax_scale(self, scale: float) -> None:
        """Models with attention-temperature scaling set one scale on every wrapper at load time."""
        for w in itertools.chain.from_iterable(self.wrappers.values()):
            w._sm_scale = scale  # expect: FC103

    def _fill_group(self, g: int, pages: List[List[int]], last_lens: List[int], n_rows: int) -> None:
        pad = n_rows - len(pages)
        counts = [len(p) for p in pages] + [1] * pad
        flat = [x for p in pages for x in p] + [0] * pad
        self.kv_indptr_host[g][1 : n_rows + 1] = torch.from_numpy(np.cumsum(counts, dtype=np.int32))  # ok: FC104
        # padded graph rows read one full dummy page
        self.kv_last_page_len_host[g][:n_rows] = torch.tensor(last_lens + [self.page_size] * pad, dtype=torch.int32)
        if len(flat) > self.kv_indices[g].numel():
            self.kv_indices[g] = torch.empty(2 * len(flat), dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indices[g][: len(flat)].copy_(torch.tensor(flat, dtype=torch.int32, pin_memory=True), non_blocking=True)

    def _plan_prefill(self, batch: StepBatch) -> None:
        nd, np_ = batch.num_decodes, batch.num_prefills
        pages = batch.kv_pages["full"][nd:]
        flat = [x for p in pages for x in p]
        self.prefill_kv_indptr_host[1 : np_ + 1] = torch.from_numpy(np.cumsum([len(p) for p in pages], dtype=np.int32))
        self.prefill_last_page_len_host[:np_] = torch.tensor(batch.last_page_lens["full"][nd:], dtype=torch.int32)
        self.prefill_kv_indices[: len(flat)].copy_(torch.tensor(flat, dtype=torch.int32, pin_memory=True), non_blocking=True)
        kw = dict(
            qo_indptr=batch.qo_indptr_gpu[: np_ + 1],
            paged_kv_indptr=self.prefill_kv_indptr_host[: np_ + 1],
            paged_kv_indices=self.prefill_kv_indices,
            paged_kv_last_page_len=self.prefill_last_page_len_host[:np_],
        )
        for name, w in zip(GROUPS, self.wrappers["prefill"]):
            w.plan(  # expect: FC102
                **kw,
                num_qo_heads=self.num_qo_heads,
                num_kv_heads=self.num_kv_heads,
                head_dim_qk=self.head_dim,
                page_size=self.page_size,
                causal=True,
                window_left=self.windows[name],
            )

    def prepare_step(self, batch: StepBatch, graph_bs: Optional[int] = None) -> None:
        nd = batch.num_decodes
        n_rows = graph_bs or nd
        decode = self.graph_wrappers[graph_bs] if graph_bs is not None else self.wrappers["decode"]
        groups = zip(decode, GROUPS, self.kv_indptr, self.kv_indptr_host, self.kv_last_page_len_host)
        for g, (w, name, indptr, indptr_h, last_h) in enumerate(groups):
            self._fill_group(g, batch.kv_pages[name][:nd], batch.last_page_lens[name][:nd], n_rows)
            indptr[: n_rows + 1].copy_(indptr_h[: n_rows + 1], non_blocking=True)  # ok: FC104
            w.plan(  # ok: FC102
                indptr_h[: n_rows + 1],
                self.kv_indices[g],
                last_h[:n_rows],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                window_left=self.windows[name],
            )
        if batch.num_prefills:
            self._plan_prefill(batch)
        # graph rows past the real decodes should read a single token
        for last in self.kv_last_page_len:
            last[nd:n_rows].fill_(1)  # expect: FC104

    def on_copy_on_write(self, src_page: int, dst_page: int) -> None:
        """Allocator callback: a shared prefix page was copied before a write; point every table at the copy."""
        for indices in self.kv_indices:
            indices.masked_fill_(indices == src_page, dst_page)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, group: int, bs: int, use_graph: bool) -> torch.Tensor:
        wrappers = self.graph_wrappers[bs] if use_graph else self.wrappers["decode"]
        return wrappers[group].run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, group: int) -> torch.Tensor:
        return self.wrappers["prefill"][group].run(q, kv_cache)
