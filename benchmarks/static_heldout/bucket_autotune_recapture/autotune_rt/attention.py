"""Decode attention with a bucket set that changes at run time.

Every bucket's graph-mode decode wrapper views the same max-size ``kv_indptr`` / ``kv_indices`` /
``kv_last_page_len``; a re-tune tears down the wrappers of dropped buckets and builds new ones over the
same buffers.  Each bucket also carries a chunk of prompt tokens (chunked prefill piggybacked on decode).
"""

from dataclasses import dataclass
from typing import Dict

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import fast_decode_plan, trtllm_batch_decode_with_kv_cache

from autotune.config import AutotuneConfig, WorkspaceTier
from autotune.workspace import get_trtllm_workspace


@dataclass
class ChunkSpec:
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor


def _make_chunk_wrapper(workspace: torch.Tensor) -> BatchPrefillWithPagedKVCacheWrapper:
    """Prefill wrapper for the prompt chunk that rides along with a decode bucket."""
    return BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")


class BucketAttention:
    def __init__(self, cfg: AutotuneConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch
        max_idx = max_bs * cfg.max_pages_per_seq

        self.graph_workspace = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.eager_workspace = torch.zeros(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.prefill_workspace = torch.zeros(WorkspaceTier.LARGE.nbytes(), dtype=torch.uint8, device=self.device)  # expect: FC106

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(max_idx, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.pages_per_req = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.page_row = torch.zeros(max_idx, dtype=torch.int64, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_idx, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.pages_per_req_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)

        self.decode_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.chunk_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.retired: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", backend="fa2")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self._plan_fn = fast_decode_plan
        self.init_bucket_buffers()
        for bs in cfg.initial_buckets:
            self.build_bucket(bs)

    def init_bucket_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def _heads(self):
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- bucket lifecycle ------------------------------------------------------------------------------
    def build_bucket(self, bs: int) -> None:
        old = self.retired.pop(bs, None)
        ws = old._float_workspace_buffer if old is not None else self.graph_workspace  # expect: FC103
        self.decode_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
            ws,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend="fa2",
        )
        self.chunk_wrappers[bs] = _make_chunk_wrapper(ws)

    def teardown_bucket(self, bs: int) -> None:
        w = self.decode_graph.pop(bs)
        self.chunk_wrappers.pop(bs, None)
        for name in ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf"):
            setattr(w, name, None)  # expect: FC103
        self.retired[bs] = w

    def reset_shared_buffers(self) -> None:
        """After a re-tune no row past the new largest bucket may keep a stale offset."""
        self.kv_indptr.zero_()  # expect: FC104

    def ready_bucket(self, bs: int, chunk: ChunkSpec) -> None:
        """Plan bucket ``bs`` over a dummy batch so that it can be warmed up and captured."""
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indices_host[:bs] = 0
        self.kv_last_page_len_host[:bs] = 1
        self.decode_graph[bs].plan(
            self.kv_indptr_host[: bs + 1], self.kv_indices_host[:bs], self.kv_last_page_len_host[:bs], **self._heads()
        )
        self._plan_chunk(bs, chunk)

    def _plan_chunk(self, bs: int, chunk: ChunkSpec) -> None:
        c = self.cfg
        self.chunk_wrappers[bs].plan(
            chunk.qo_indptr_host,
            chunk.kv_indptr_host,
            chunk.kv_indices,
            chunk.last_page_len_host,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    # ---- per step --------------------------------------------------------------------------------------
    def prepare_replay(self, bs: int, n_pages_np: np.ndarray, last_np: np.ndarray, page_ids_np: np.ndarray, chunk: ChunkSpec) -> None:
        n = n_pages_np.shape[0]
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(n_pages_np, out=indptr_np[1 : n + 1])
        indptr_np[n + 1 :] = indptr_np[n]
        total = int(indptr_np[-1])
        self.kv_indptr_host[: bs + 1] = torch.from_numpy(indptr_np)
        self.kv_indices_host[:total] = torch.from_numpy(page_ids_np.astype(np.int32))
        self.kv_last_page_len_host[:n] = torch.from_numpy(last_np.astype(np.int32))
        self.kv_last_page_len_host[n:bs] = 1
        self.pages_per_req_host[:n] = torch.from_numpy(n_pages_np.astype(np.int32))
        self.pages_per_req_host[n:bs] = 0

        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(self.kv_indices_host[:total], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        self.pages_per_req[:bs].copy_(self.pages_per_req_host[:bs], non_blocking=True)
        rows = torch.arange(bs, device=self.device)
        self.page_row[:total].copy_(torch.repeat_interleave(rows, self.pages_per_req[:bs]))  # expect: FC101
        self._plan_fn(  # expect: FC102
            self.decode_graph[bs],
            indptr=self.kv_indptr[: bs + 1],
            indices=self.kv_indices_host[:total],
            last_page_len=self.kv_last_page_len_host[:bs],
            **self._heads(),
        )
        self._plan_chunk(bs, chunk)

    def plan_eager(self, n: int, n_pages_np: np.ndarray, last_np: np.ndarray, page_ids_np: np.ndarray) -> None:
        indptr_np = np.concatenate([[0], np.cumsum(n_pages_np)]).astype(np.int32)
        total = int(indptr_np[-1])
        self.kv_indptr_host[: n + 1] = torch.from_numpy(indptr_np)
        self.kv_indices_host[:total] = torch.from_numpy(page_ids_np.astype(np.int32))
        self.kv_last_page_len_host[:n] = torch.from_numpy(last_np.astype(np.int32))
        self.eager.plan(  # ok: FC102
            self.kv_indptr_host[: n + 1],
            self.kv_indices_host[:total],
            self.kv_last_page_len_host[:n],
            **self._heads(),
        )

    # ---- kernels ------------------------------------------------------------------------------------------
    def forward_decode(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        return self.decode_graph[bs].run(q, kv)  # ok: FC108

    def forward_chunk(self, q_chunk: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        return self.chunk_wrappers[bs].run(q_chunk, kv)  # expect: FC108

    def forward_eager(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.eager.run(q, kv)

    def forward_long(self, q, kv, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
        ws = get_trtllm_workspace(self.cfg.trtllm_workspace_bytes(), self.device)
        return trtllm_batch_decode_with_kv_cache(
            q, kv, ws, block_tables, seq_lens, max_len, bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0
        )
