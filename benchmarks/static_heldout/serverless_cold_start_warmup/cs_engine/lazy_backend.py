import logging
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from coldstart import WorkspacePlan, fallback_workspace_for

from .batch import StepBatch

logger = logging.getLogger(__name__)


class LazyFlashInferBackend:
    """Creates wrappers and their workspaces on first use so the process is ready to accept in ~1 s."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, page_size: int, num_pages: int,
                 max_batch: int, device: str, ws_plan: Optional[WorkspacePlan]):
        self.heads, self.kv_heads, self.head_dim, self.page_size = heads, kv_heads, head_dim, page_size
        self.device = device
        self.ws_plan = ws_plan
        self.max_batch = max_batch
        self.num_pages = num_pages
        self._lazy: Dict[str, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._workspaces: Dict[str, torch.Tensor] = {}
        self._trtllm_ws: Optional[torch.Tensor] = None
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_indptr: Optional[torch.Tensor] = None
        self.graph_indices: Optional[torch.Tensor] = None
        self.graph_last_page_len: Optional[torch.Tensor] = None
        self.graph_indptr_cpu = torch.zeros(max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.graph_last_page_len_cpu = torch.ones(max_batch, dtype=torch.int32, pin_memory=True)

    def _workspace(self, kind: str) -> torch.Tensor:
        ws = self._workspaces.get(kind)
        if ws is None:
            if self.ws_plan is None:
                ws = fallback_workspace_for(self.device)
            else:
                ws = torch.empty(self.ws_plan.decode_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
            self._workspaces[kind] = ws
        return ws

    def _trtllm_workspace(self) -> torch.Tensor:
        if self._trtllm_ws is None:
            nbytes = self.ws_plan.trtllm_bytes if self.ws_plan is not None else self.max_batch * self.heads * 65536
            self._trtllm_ws = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        return self._trtllm_ws

    def forward_long(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, self._trtllm_workspace(), block_tables, seq_lens,
                                                 max_seq_len)

    def _ensure_decode(self) -> BatchDecodeWithPagedKVCacheWrapper:
        if "decode" not in self._lazy:
            self._lazy["decode"] = BatchDecodeWithPagedKVCacheWrapper(self._workspace("decode"), "NHD",
                                                                      use_tensor_cores=True)
        return self._lazy["decode"]

    def init_graph_buffers(self) -> None:
        self.graph_indptr = torch.zeros(self.max_batch + 1, dtype=torch.int32, device=self.device)
        self.graph_indices = torch.zeros(self.num_pages, dtype=torch.int32, device=self.device)
        self.graph_last_page_len = torch.ones(self.max_batch, dtype=torch.int32, device=self.device)
        self.graph_last_page_len.fill_(1)  # ok: FC104

    def ensure_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        if bs not in self.graph_wrappers:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self._workspace("graph"), "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.graph_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )
        return self.graph_wrappers[bs]

    def plan_eager(self, batch: StepBatch) -> None:
        w = self._ensure_decode()
        w.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu,  # expect: FC102
               self.heads, self.kv_heads, self.head_dim, self.page_size)

    def plan_graph(self, batch: StepBatch, padded: int) -> None:
        bs = batch.bs
        self.graph_indptr_cpu[: bs + 1].copy_(batch.kv_indptr_cpu)
        self.graph_indptr_cpu[bs + 1 : padded + 1] = self.graph_indptr_cpu[bs]
        self.graph_last_page_len_cpu[:bs].copy_(batch.kv_last_page_len_cpu)
        self.graph_indptr[: padded + 1].copy_(self.graph_indptr_cpu[: padded + 1], non_blocking=True)  # ok: FC104
        self.graph_indices[: batch.kv_indices.shape[0]].copy_(batch.kv_indices, non_blocking=True)
        self.graph_wrappers[padded].plan(  # ok: FC102
            self.graph_indptr_cpu[: padded + 1], self.graph_indices, self.graph_last_page_len_cpu[:padded],
            self.heads, self.kv_heads, self.head_dim, self.page_size,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs] if self.graph_indptr is not None else self._lazy["decode"]
            return w.run(q, kv_cache)  # ok: FC108
        return self._ensure_decode().run(q, kv_cache)  # expect: FC108

    def workspace_report(self) -> Dict[str, int]:
        report = {}
        for name, w in self._lazy.items():
            report[name] = w._float_workspace_buffer.numel()  # expect: FC103
        for bs, w in self.graph_wrappers.items():
            int_ws = vars(w).get("_int_workspace_buffer")  # expect: FC103
            report[f"graph{bs}"] = 0 if int_ws is None else int_ws.numel()
        return report
