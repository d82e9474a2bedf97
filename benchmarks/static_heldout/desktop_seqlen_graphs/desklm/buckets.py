"""One decode graph per context-length bucket.

With a single sequence the batch is always 1; what changes the kernel launch is the KV length
(the split-k chunking FlashInfer picks at plan time), so graphs are keyed by a length bucket and
a bucket's graph is replayed until the context outgrows it.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from desklm.kv.paged_cache import SingleSeqKVCache
from desklm.settings import WORKSPACE_BYTES, DeskSettings


class LengthBuckets:
    def __init__(self, lengths: List[int], s: DeskSettings, kv: SingleSeqKVCache, device: torch.device):
        assert all(L % s.page_size == 0 for L in lengths), "bucket lengths must be whole pages"  # expect: FC109
        self.lengths = sorted(lengths)
        self.s = s
        self.kv = kv
        self.device = device
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.gen_workspace = torch.empty(s.gen_workspace_bytes(), dtype=torch.uint8, device=device)
        self.gen_workspace.zero_()
        self.kv_indptr = torch.zeros(2, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(s.max_pages, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(1, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(1, dtype=torch.int32, pin_memory=True)
        self.local_indptr_host = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.seq_lens_t = torch.zeros(1, dtype=torch.int32, device=device)
        self.block_table = kv.page_ids.view(1, -1)
        self.wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_global = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.local_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_out: Dict[int, torch.Tensor] = {}
        self.active: Optional[int] = None

    def init_buffers(self) -> None:
        self.last_page_len.fill_(1)  # ok: FC104
        for L in self.lengths:
            self.wrappers[L] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr,
                paged_kv_indices_buffer=self.kv_indices[: L // self.s.page_size],
                paged_kv_last_page_len_buffer=self.last_page_len,
            )

    def bucket_for(self, seq_len: int) -> Optional[int]:
        assert self.lengths, "no length buckets configured"  # ok: FC109
        for L in self.lengths:
            if seq_len < L:
                return L
        return None

    def _plan_args(self) -> dict:
        s = self.s
        return dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, page_size=s.page_size, q_data_type=torch.float16)

    def _plan_local(self, seq_len: int) -> None:
        ps = self.s.page_size
        n_pages = self.kv.num_pages(seq_len)
        first = max(0, n_pages - self.s.local_window // ps - 1)
        self.local_indptr_host[1] = n_pages - first
        self.local_decode.plan(self.local_indptr_host, self.kv.page_ids[first:n_pages], self.last_page_host, window_left=self.s.local_window, **self._plan_args())  # ok: FC102

    def prepare_bucket(self, bucket: int, seq_len: int) -> None:
        """Replay preparation (configured): fill the bound buffers, then plan."""
        ps = self.s.page_size
        n_pages = self.kv.num_pages(seq_len)
        self.kv_indptr_host[1] = n_pages
        self.last_page_host[0] = (seq_len - 1) % ps + 1
        self.kv_indptr.copy_(self.kv_indptr_host, non_blocking=True)  # ok: FC104
        self.last_page_len.copy_(self.last_page_host, non_blocking=True)  # ok: FC104
        self.seq_lens_t.fill_(seq_len)
        self.active = bucket
        self._plan_local(seq_len)
        self.wrappers[bucket].plan(self.kv_indptr_host, self.kv.page_ids[:n_pages], self.last_page_len, **self._plan_args())  # expect: FC102

    def plan_beyond_buckets(self, seq_len: int) -> None:
        """Contexts past the largest bucket run eagerly."""
        ps = self.s.page_size
        n_pages = self.kv.num_pages(seq_len)
        self.active = None
        self.last_page_host[0] = (seq_len - 1) % ps + 1
        indptr = torch.tensor([0, n_pages], dtype=torch.int32, device=self.device)
        self.eager_global.plan(indptr, self.kv.page_ids[:n_pages], self.last_page_host, **self._plan_args())  # expect: FC102
        self._plan_local(seq_len)

    def record(self, bucket: int, forward: Callable[[], torch.Tensor]) -> None:
        """Capture the decode step of one bucket (configured capture path)."""
        w = self.wrappers[bucket]
        if not getattr(w, "_use_cuda_graph", False):  # expect: FC103
            raise RuntimeError(f"bucket {bucket} wrapper is not in graph mode")
        self.kv_indptr_host[1] = bucket // self.s.page_size
        self.active = bucket
        w.plan(self.kv_indptr_host, self.kv_indices, self.last_page_host, **self._plan_args())
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.graph_out[bucket] = forward()
        self.graphs[bucket] = g

    # ---- called from the attention layers -----------------------------------------------------
    def attend_global(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.s.use_trtllm_gen:
            return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.gen_workspace, self.block_table, self.seq_lens_t, self.s.max_context, self.s.head_dim ** -0.5, 1.0)  # ok: FC105
        w = self.wrappers[self.active] if self.active is not None else self.eager_global
        return w.run(q, kv_cache)  # ok: FC108

    def attend_local(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.local_decode.run(q, kv_cache)  # expect: FC108
