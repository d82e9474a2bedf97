"""Per-worker FlashInfer attention over the shared page pool (and a peer worker's pool)."""

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from ipckv import IpcServeConfig, StepMessage
from ipc_worker.pagetable import apply_page_table
from ipc_worker.stager import StagedBatch
from ipc_worker.workspace import eager_workspace, graph_workspace, zeroed_trtllm_workspace


def make_peer_decode(ws: torch.Tensor) -> BatchDecodeWithPagedKVCacheWrapper:
    return BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)


def describe_plan(w: BatchDecodeWithPagedKVCacheWrapper) -> str:
    info = w.__dict__.get("_plan_info")  # expect: FC103
    return f"plan_info={info!r}"


class WorkerAttention:
    def __init__(self, cfg: IpcServeConfig, device: torch.device, worker_id: int):
        self.cfg = cfg
        self.device = device
        self.worker_id = worker_id
        self.sm_scale = cfg.head_dim ** -0.5
        self.eager_ws = eager_workspace(cfg.eager_workspace_bytes, device)
        self.prefill_ws = eager_workspace(cfg.eager_workspace_bytes, device)
        self.peer_ws = eager_workspace(cfg.eager_workspace_bytes, device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.peer_decode = make_peer_decode(self.peer_ws)
        self.trtllm_ws = torch.zeros(cfg.trtllm_decode_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_ctx_ws = zeroed_trtllm_workspace(cfg.trtllm_ctx_ws_bytes, device)
        self.kv_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=device)
        self.positions_dev = torch.zeros(cfg.max_batch, dtype=torch.int64, device=device)
        self.lse_scratch = torch.zeros((cfg.max_batch, cfg.num_qo_heads), dtype=torch.float32, device=device)
        self.scratch_cap = cfg.max_batch
        self.bucket_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.peer_kv: Optional[torch.Tensor] = None

    def init_graph_wrappers(self) -> None:
        cfg = self.cfg
        mb = max(cfg.decode_buckets)
        self.g_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=self.device)
        self.g_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.g_last = torch.ones(mb, dtype=torch.int32, device=self.device)
        self.peer_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.indices_pinned = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.peer_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.peer_last_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.peer_indices_pinned = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.indptr_np = self.indptr_pinned.numpy()
        self.last_np = self.last_pinned.numpy()
        self.indices_np = self.indices_pinned.numpy()
        self.peer_indptr_np = self.peer_indptr_pinned.numpy()
        self.peer_last_np = self.peer_last_pinned.numpy()
        self.peer_indices_np = self.peer_indices_pinned.numpy()
        self.graph_ws = graph_workspace(self.device)
        for bs in cfg.decode_buckets:
            self.bucket_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.g_indptr[: bs + 1],
                paged_kv_indices_buffer=self.g_indices,
                paged_kv_last_page_len_buffer=self.g_last[:bs],
            )
        self.g_indices.zero_()  # ok: FC104

    def attach_peer(self, peer_kv: torch.Tensor) -> None:
        self.peer_kv = peer_kv

    # ------------------------------------------------------------ eager
    def plan_eager(self, staged: StagedBatch) -> None:
        cfg = self.cfg
        bs = staged.batch_size
        self.kv_indptr[: bs + 1].copy_(staged.kv_indptr_cpu, non_blocking=True)
        self.decode_wrapper.plan(  # expect: FC102
            self.kv_indptr[: bs + 1],
            staged.kv_indices,
            staged.last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=self.sm_scale,
        )

    def plan_prefill(self, staged: StagedBatch) -> None:
        cfg = self.cfg
        self.prefill_wrapper.plan(  # expect: FC102
            staged.qo_indptr,
            staged.kv_indptr_cpu,
            staged.kv_indices,
            staged.last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
        )

    # ------------------------------------------------------------ buckets
    def prepare_bucket(self, bs: int, msg: StepMessage) -> None:
        cfg = self.cfg
        ps = cfg.page_size
        real = len(msg.req_ids)
        lens = np.zeros(bs, dtype=np.int64)
        lens[:real] = msg.seq_lens_np
        table = np.zeros((bs, msg.page_table_np.shape[1]), dtype=np.int32)
        table[:real] = msg.page_table_np
        nnz = apply_page_table(self.g_indices, self.indices_pinned, self.indices_np, table, lens, ps)  # ok: FC104
        pages = (lens + ps - 1) // ps
        self.indptr_np[0] = 0
        np.cumsum(pages, out=self.indptr_np[1 : bs + 1])
        self.last_np[:bs] = np.maximum(lens - (pages - 1) * ps, 1)
        self.g_indptr[: bs + 1].copy_(self.indptr_pinned[: bs + 1], non_blocking=True)
        self.g_last[:bs].copy_(self.last_pinned[:bs], non_blocking=True)
        w = self.bucket_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"bucket wrapper for {bs} rows was built for another batch size")
        w.plan(  # ok: FC102
            self.indptr_pinned[: bs + 1],
            self.g_indices[:nnz],
            self.last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            ps,
            sm_scale=self.sm_scale,
        )
        self._plan_peer(bs, msg)
        if bs > self.scratch_cap:
            self.lse_scratch = torch.empty((bs, cfg.num_qo_heads), dtype=torch.float32, device=self.device)  # expect: FC107
            self.scratch_cap = bs
        self.positions_dev[:real].copy_(torch.from_numpy(msg.positions_np), non_blocking=True)  # ok: FC104

    def _plan_peer(self, bs: int, msg: StepMessage) -> None:
        cfg = self.cfg
        ps = cfg.page_size
        real = len(msg.req_ids)
        lens = np.zeros(bs, dtype=np.int64)
        lens[:real] = msg.peer_lens_np
        table = np.zeros((bs, msg.peer_page_table_np.shape[1]), dtype=np.int32)
        table[:real] = msg.peer_page_table_np
        apply_page_table(self.peer_indices, self.peer_indices_pinned, self.peer_indices_np, table, lens, ps)
        pages = (lens + ps - 1) // ps
        self.peer_indptr_np[0] = 0
        np.cumsum(pages, out=self.peer_indptr_np[1 : bs + 1])
        self.peer_last_np[:bs] = np.maximum(lens - (pages - 1) * ps, 1)
        self.peer_decode.plan(
            self.peer_indptr_pinned[: bs + 1],
            self.peer_indices,
            self.peer_last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            ps,
            sm_scale=self.sm_scale,
        )

    # ------------------------------------------------------------ forward
    def forward_decode_graph(self, q: torch.Tensor, kv_cache: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        o_local, lse_local = self.bucket_wrappers[bs].run_return_lse(q, kv_cache)  # ok: FC108
        if self.peer_kv is None:
            return o_local
        # rows whose older pages live in the peer worker's pool, opened through its IPC handle
        o_peer, lse_peer = self.peer_decode.run_return_lse(q, self.peer_kv[layer])  # expect: FC108
        o, _ = merge_state(o_local, lse_local, o_peer, lse_peer)
        return o

    def forward_decode_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.decode_wrapper.run(q, kv_cache)

    def forward_long(self, q, kv_cache, staged: StagedBatch, max_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.trtllm_ws, staged.block_tables, staged.seq_lens, max_len, self.sm_scale, 1.0
        )

    def forward_prefill(self, q, kv_cache, staged: StagedBatch, max_q: int, max_kv: int) -> torch.Tensor:
        if max_kv < self.cfg.long_ctx_len:
            return self.prefill_wrapper.run(q, kv_cache)
        kv_cu = torch.cumsum(staged.seq_lens, 0, dtype=torch.int32)
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            self.trtllm_ctx_ws,
            staged.block_tables,
            staged.seq_lens,
            max_q,
            max_kv,
            self.sm_scale,
            1.0,
            staged.batch_size,
            staged.qo_indptr,
            torch.nn.functional.pad(kv_cu, (1, 0)),
        )
